"""Study 1's convex K=5 ellipsoid and ball cells at today's defaults (the tuned-against-Raw
converged check), seeds 0-4: ``python3 run.py``; trials already stored are reused."""
from pathlib import Path

from gems_lab.reproduce import Options, reproduce

if __name__ == "__main__":
    options = Options(studies=(1,), ks=(5,), spaces=("ellipsoid", "ball"), k2_split="")
    print(reproduce(options, Path(__file__).resolve().parent / "out", jobs=1,
                    command="python3 run.py  # Options(studies=(1,), ks=(5,), "
                            "spaces=('ellipsoid', 'ball'), k2_split=''), jobs=1"))
