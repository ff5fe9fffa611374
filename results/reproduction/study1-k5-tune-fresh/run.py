"""Study 1's convex K=5 ellipsoid and ball cells with ``tune-fresh`` (the default since it
was added): GEMS tuned keeps a fresh model trained to convergence where the held-out 20 %
of the public sample prefers it. Seeds 0-4: ``python3 run.py``; trials already stored are
reused. The same cells without it: ``../study1-k5-paper-spaces``."""
from pathlib import Path

from gems_lab.reproduce import Options, reproduce

if __name__ == "__main__":
    options = Options(studies=(1,), ks=(5,), spaces=("ellipsoid", "ball"), k2_split="")
    print(reproduce(options, Path(__file__).resolve().parent / "out", jobs=1,
                    command="python3 run.py  # Options(studies=(1,), ks=(5,), "
                            "spaces=('ellipsoid', 'ball'), k2_split=''), jobs=1"))
