"""Where one run's time goes: the real ServerApp and ClientApp over the in-process Grid
under cProfile, the cumulative seconds of the steps that cost (each site's space and its
parts, the map, the selection round's candidates, the server's data).

    python3 benchmarks/profile_run.py --nodes 5 --set dataset=fashion-mnist model=kernel

In process the sites run one after another on this process's threads (a Flower run
spreads them over two actors), so the seconds add up to the run's wall time; the
profiler's own cost is included. Prints a table and writes the JSON envelope.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--nodes", "3", "--set", "model=kernel", "num-directions=20"]]

#: (step, module path suffix, function name): the steps reported, in the run's order
STEPS = [
    ("identify: the map's round (the kernel model's k-means)", "protocol/map_round.py", "collect_summaries"),
    ("server data (loaded, scaled, mapped)", "serverapp/run.py", "load_server_side"),
    ("sites' spaces, all", "protocol/node.py", "build_local_space"),
    ("  local training (Adam's epochs)", "learning/train.py", "train_until_converged"),
    ("  local training (exact solve)", "learning/exact.py", "solve_softmax"),
    ("  Gram matrix and factor", "geometry/kinds.py", "node_gram"),
    ("    Gram matrix, float32", "geometry/gram.py", "float32_gram"),
    ("    top eigenpairs", "geometry/gram.py", "top_eigenpairs"),
    ("  radius search", "geometry/gram_search.py", "search_gram_radius"),
    ("the map applied to rows (all)", "data/kernel_features.py", "transform"),
    ("Gram matrices rebuilt from factors (all)", "geometry/gram.py", "from_factor"),
    ("replies decoded", "protocol/space_replies.py", "decode_reply"),
    ("selection round's candidates", "protocol/selection_round.py", "candidate_points"),
    ("  gaussian points", "geometry/virtual.py", "gaussian_points"),
    ("  LDA points", "geometry/pooled.py", "pooled_ldas"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run settings over the app's defaults (dataset=fashion-mnist ...)")
    parser.add_argument("--out", default=default_out("profile_run"))
    args = parser.parse_args()
    from inprocess_run import run_apps

    from tests.helpers import app_defaults

    overrides = dict(item.split("=", 1) for item in args.set)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {**app_defaults(), **_typed(overrides, app_defaults()), "output-dir": tmp}
        profile = cProfile.Profile()
        profile.enable()
        results, _, wall = run_apps(cfg, args.nodes)
        profile.disable()
    stats = pstats.Stats(profile).stats
    rows, records = [], []
    for step, path, name in STEPS:
        found = [(calls, cumulative) for (file, _, func), (_, calls, _, cumulative, _)
                 in stats.items() if func == name and file.replace("\\", "/").endswith(path)]
        if not found:
            continue
        calls, seconds = sum(c for c, _ in found), sum(s for _, s in found)
        rows.append([f"{seconds:.1f}", calls, step])
        records.append({"step": step.strip(), "function": f"{path}:{name}", "calls": calls,
                        "seconds": round(seconds, 2)})
    accuracy = results["rows"]["GEMS"]["accuracy"] if "GEMS" in results.get("rows", {}) else None
    print(f"wall {wall:.1f} s (profiled), test accuracy {accuracy}")
    print_table(["s", "calls", "step"], rows, right=2)
    write_envelope("profile_run", args.out, {"nodes": args.nodes, "settings": overrides,
                                             "wall_s": round(wall, 1), "accuracy": accuracy,
                                             "steps": records})


def _typed(overrides: dict[str, str], defaults: dict) -> dict:
    """Each value as the type of the app's default for its key."""
    out = {}
    for key, text in overrides.items():
        default = defaults.get(key)
        if isinstance(default, bool):
            out[key] = text.lower() == "true"
        elif isinstance(default, int):
            out[key] = int(text)
        elif isinstance(default, float):
            out[key] = float(text)
        else:
            out[key] = text
    return out


if __name__ == "__main__":
    main()
