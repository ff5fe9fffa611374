"""Study 7 in full: every point of the study (``closed-form``, ``pooled`` and the default
``auto``) and the refined logistic model, on every Dirichlet division (alpha 0.05, 0.1,
0.5; K = 5 and 20), logistic and MLP. ``python3 run.py N`` runs seeds 0..N-1 (default 5).
The report and the trials' outcomes (``trials/``) are written next to this file; trials
already stored there are reused, so an interrupted run resumes. The ``auto`` trials are
those of ``../study7-default`` (the same trials: the same keys and outcomes)."""
import sys
from pathlib import Path

from gems_fl.reproduce import Options, reproduce

if __name__ == "__main__":
    seeds = tuple(range(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
    options = Options(studies=(7,), seeds=seeds)
    print(reproduce(options, Path(__file__).resolve().parent, jobs=2,
                    command=f"python3 run.py {len(seeds)}  # Options(studies=(7,), "
                            f"seeds={seeds}), jobs=2"))
