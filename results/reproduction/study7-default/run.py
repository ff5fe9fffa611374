"""Study 7, reduced to fit a session: the default point only (gram-point=auto) and the
refined logistic model, on every Dirichlet division of the study. ``python3 run.py N``
runs seeds 0..N-1 (default 1). The report and the trials' outcomes (``trials/``) are
written next to this file; trials already stored there are reused, so an interrupted run
resumes."""
import sys
from pathlib import Path

from gems_lab.reproduce import Options, reproduce

if __name__ == "__main__":
    seeds = tuple(range(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
    options = Options(studies=(7,), seeds=seeds, dirichlet_alphas=(0.05, 0.1, 0.5),
                      dirichlet_ks=(5, 20), dirichlet_points=("auto",))
    print(reproduce(options, Path(__file__).resolve().parent, jobs=2,
                    command=f"python3 run.py {len(seeds)}  # Options(studies=(7,), "
                            f"seeds={seeds}, dirichlet_alphas=(0.05, 0.1, 0.5), "
                            "dirichlet_ks=(5, 20), dirichlet_points=('auto',)), jobs=2"))
