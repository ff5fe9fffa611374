"""Study 7, reduced to fit a session: the default point only (gram-point=auto) and the
refined logistic model, every Dirichlet division of the study, seeds 0 and 1."""
from pathlib import Path

from gems_fl.reproduce import Options, reproduce

if __name__ == "__main__":
    options = Options(studies=(7,), seeds=(0, 1), dirichlet_alphas=(0.05, 0.1, 0.5),
                      dirichlet_ks=(5, 20), dirichlet_points=("auto",))
    print(reproduce(options, Path("/work/repro7d/out"), jobs=2,
                    command="python3 run.py  # Options(studies=(7,), seeds=(0, 1), "
                            "dirichlet_alphas=(0.05, 0.1, 0.5), dirichlet_ks=(5, 20), "
                            "dirichlet_points=('auto',)), jobs=2"))
