"""Flower's own cost beside a GEMS run: an empty two-round app on the same private
SuperLink, then `gems-fl run` as a user runs it, and the ratio of their wall times.

    python3 benchmarks/flower_floor.py --nodes 5 \
        --gems "dataset='fashion-mnist'" "dataset='fashion-mnist' model='kernel'"

The empty app (written to a temporary folder) has a ServerApp that sends every node an
empty message and waits for the replies, twice, and a ClientApp that answers each with an
empty reply: what any two-round Flower app costs here (the SuperLink, SuperExec,
``flwr-simulation``, Ray and its actors started and stopped, two rounds of messages). It
runs through :class:`gems_fl.running.superlink.LocalSuperLink`, the SuperLink `gems-fl
run` starts, with the federation settings `gems-fl run` gives Flower (``num-supernodes``,
``client-resources-num-cpus=1``); its wall time runs from the SuperLink's start to its
stop. Each GEMS run is `benchmarks/scale.py`'s (the `gems-fl run` command, its wall time
and peak memory). Run one after the other on the idle machine. Prints a table and
writes JSON (results/benchmarks/flower_floor.json).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--nodes", "2", "--repeats", "1"]]

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flower-floor"
version = "1.0.0"
description = "Two rounds of empty messages: Flower's own cost"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "gems-fl"

[tool.flwr.app.components]
serverapp = "floor_app:server"
clientapp = "floor_app:client"

[tool.flwr.app.config]
num-server-rounds = 2
nodes = 1
"""

APP = '''\
"""Two rounds of empty messages to every node: Flower's own cost."""
import time

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    wanted = int(context.run_config.get("nodes", 1))
    while len(list(grid.get_node_ids())) < wanted:
        time.sleep(0.1)
    nodes = sorted(grid.get_node_ids())
    for server_round in range(1, int(context.run_config["num-server-rounds"]) + 1):
        messages = [Message(RecordDict(), dst_node_id=n, message_type="train",
                            group_id=str(server_round)) for n in nodes]
        replies = list(grid.send_and_receive(messages))
        failed = [r for r in replies if r.has_error()]
        if len(replies) != len(nodes) or failed:
            raise RuntimeError(f"round {server_round}: {len(replies)} replies, "
                               f"{len(failed)} errors, for {len(nodes)} nodes")
        print(f"FLOOR round {server_round}: {len(replies)} replies", flush=True)


@client.train()
def train(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)
'''


def empty_app_wall(nodes: int) -> dict:
    """One run of the empty app through a private SuperLink: seconds and final status."""
    from gems_fl.running.superlink import CONNECTION, LocalSuperLink, run_status

    work = Path(tempfile.mkdtemp(prefix="floor-"))
    try:
        app = work / "app"
        app.mkdir()
        (app / "pyproject.toml").write_text(PYPROJECT)
        (app / "floor_app.py").write_text(APP)
        t0 = time.perf_counter()
        with LocalSuperLink(work / "link") as link:  # stopped, with all it started, on exit
            out = link.flwr_streamed("run", str(app), CONNECTION, "--stream", "--run-config",
                                     f"nodes={nodes}", "--federation-config",
                                     f"num-supernodes={nodes} client-resources-num-cpus=1",
                                     log=_Quiet())
            match = re.search(r"Successfully started run (\d+)", out)
            status = run_status(link, int(match.group(1))) if match else "not started"
            rounds = len(re.findall(r"FLOOR round \d+", out))
        return {"wall_s": time.perf_counter() - t0, "status": status, "rounds_logged": rounds}
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Quiet:
    """A log that keeps nothing (the output comes back whole from ``flwr_streamed``)."""

    def add(self, line: str) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="runs of the empty app")
    parser.add_argument("--gems", nargs="*", default=[], metavar="RUN-CONFIG",
                        help="`gems-fl run --run-config` strings to time beside it")
    parser.add_argument("--out", default=default_out("flower_floor"))
    args = parser.parse_args()
    from scale import run as gems_run

    floors = [empty_app_wall(args.nodes) for _ in range(args.repeats)]
    bad = [f for f in floors if not f["status"].startswith("finished:completed")]
    if bad:
        raise SystemExit(f"the empty app did not complete: {bad}")
    floor = min(f["wall_s"] for f in floors)
    rows = [[f"{f['wall_s']:.1f}", "1.0" if f["wall_s"] == floor else "", "",
             f"empty two-round app (run {i + 1})"] for i, f in enumerate(floors)]
    gems = []
    for run_config in args.gems:
        with tempfile.TemporaryDirectory() as tmp:
            report = gems_run(args.nodes, run_config, Path(tmp))
        report.pop("timeline_mb", None)
        report.pop("output_tail", None)
        gems.append(report)
        rows.append([f"{report['wall_s']:.1f}", f"{report['wall_s'] / floor:.1f}",
                     report.get("gems_accuracy"), f"gems-fl run --run-config \"{run_config}\""])
    print(f"{args.nodes} nodes; ratio: a run's wall time over the empty app's fastest")
    print_table(["wall s", "ratio", "GEMS test", "run"], rows, right=3)
    write_envelope("flower_floor", args.out, {"nodes": args.nodes, "empty_app": floors,
                                              "floor_s": floor, "gems": gems},
                   settings={"gems": args.gems})


if __name__ == "__main__":
    main()
