"""Study 7 in full: every point of the study (``closed-form``, ``pooled`` and the default
``auto``), the paper's ellipsoid, the refined model (logistic and MLP) and FedAvg/FedProx
with local SGD, on every Dirichlet division (alpha 0.05, 0.1, 0.5; K = 5 and 20).

``python3 run.py N`` runs seeds 0..N-1 (default 5). ``python3 run.py N --no-baselines``
leaves out FedAvg/FedProx (their 100-round runs cost most of the study's time) and writes
the report of the GEMS trials alone. The report and the trials' outcomes (``trials/``)
are written next to this file; trials already stored there are reused, so an interrupted
run resumes. The ``auto`` trials are those of ``../study7-default`` (the same keys and
outcomes)."""
import sys
from pathlib import Path

from gems_lab.reproduce import Options, reproduce

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    unknown = [a for a in sys.argv[1:] if a.startswith("--") and a != "--no-baselines"]
    if unknown:
        sys.exit(f"unknown option(s) {unknown}; usage: python3 run.py [N] [--no-baselines]")
    baselines = "--no-baselines" not in sys.argv
    seeds = tuple(range(int(args[0]) if args else 5))
    extra = {} if baselines else {"dirichlet_baselines": ()}
    options = Options(studies=(7,), seeds=seeds, **extra)
    shown = "" if baselines else ", dirichlet_baselines=()"
    print(reproduce(options, Path(__file__).resolve().parent, jobs=2,
                    command=f"python3 run.py {len(seeds)}{'' if baselines else ' --no-baselines'}"
                            f"  # Options(studies=(7,), seeds={seeds}{shown}), jobs=2"))
