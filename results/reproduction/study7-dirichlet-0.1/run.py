"""Study 7, reduced to fit this session: Dirichlet(0.1), K = 5 and 20, seeds 0 and 1."""
from pathlib import Path

from gems_lab.reproduce import Options, reproduce

if __name__ == "__main__":
    options = Options(studies=(7,), seeds=(0, 1), dirichlet_alphas=(0.1,), dirichlet_ks=(5, 20))
    print(reproduce(options, Path("/work/repro7s/out"), jobs=1,
                    command="python3 run.py  # Options(studies=(7,), seeds=(0, 1), "
                            "dirichlet_alphas=(0.1,), dirichlet_ks=(5, 20)), jobs=1"))
