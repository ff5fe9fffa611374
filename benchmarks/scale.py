"""Many nodes through Flower: wall time, peak memory of the whole process tree, nodes
accepted, bytes per round, for `gems-fl run --nodes N` as a user runs it.

    python3 benchmarks/scale.py --nodes 100 --run-config "dataset='fashion-mnist' \
        label-division='classes-per-node:2'"

Prints a table and writes JSON (``--out``, default ``results/benchmarks/scale.json``). The
memory figure is the largest sum, over one-second samples, of the resident set sizes
of every process whose environment carries the run's marker (the SuperLink, SuperExec,
flwr-simulation, Ray and its workers) plus ``gems-fl`` itself; the JSON also gives it per
process role at that peak, each role's own peak, the peak of the proportional sum (PSS),
which counts a page that several processes map (Ray's object store) once, and a timeline
(every ``TIMELINE_EVERY`` seconds, MB per role) to lay beside the run's stage lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--nodes", "3", "--run-config", "label-division='paper'"]]

from gems_fl.running.timing import timing_line

MARKER = "GEMS_FL_RUN_MARKER"
#: seconds between two points of the memory timeline
TIMELINE_EVERY = 5.0


def _role(pid: int) -> str:
    """A process's part in the run, from its command line (``ray::...`` workers by name)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [Path(a.decode(errors="replace")).name for a in args if a]
    for word in words:
        if word.startswith(("flower-", "flwr-", "ray::", "gems-fl", "raylet", "gcs_server")):
            return word.split()[0]
    if len(words) > 2 and words[1] == "-m":
        return words[2]
    return words[0] if words else "?"


def _tree_rss(root_pid: int) -> tuple[dict[str, int], int]:
    """Bytes resident per role (:func:`_role`) in ``root_pid`` and every process that
    carries the run's marker, and their proportional sum (PSS: a page shared by several
    processes, as Ray's object store maps its objects into each worker, counts once)."""
    roles: dict[str, int] = {}
    pss = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if pid != root_pid:
                env = Path(f"/proc/{pid}/environ").read_bytes()
                if MARKER.encode() not in env:
                    continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    role = _role(pid)
                    roles[role] = roles.get(role, 0) + int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return roles, pss


def run(nodes: int, run_config: str, out_dir: Path, cpus_per_node: int = 1) -> dict:
    cmd = [sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), "--nodes", str(nodes),
           "--output-dir", str(out_dir), "--run-config", run_config,
           "--cpus-per-node", str(cpus_per_node)]
    peak, at_peak, role_peaks, peak_pss = 0, {}, {}, 0
    timeline: list[dict] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, at_peak, peak_pss
        while not done.is_set():
            roles, pss = _tree_rss(proc.pid)
            peak_pss = max(peak_pss, pss)
            if sum(roles.values()) > peak:
                peak, at_peak = sum(roles.values()), roles
            for role, size in roles.items():
                role_peaks[role] = max(role_peaks.get(role, 0), size)
            now = time.perf_counter() - t0
            if not timeline or now - timeline[-1]["t_s"] >= TIMELINE_EVERY:
                timeline.append({"t_s": round(now, 1), "total_mb": round(sum(roles.values()) / 2**20),
                                 **{k: round(v / 2**20) for k, v in roles.items()}})
            done.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0]
    done.set()
    sampler.join()
    wall = time.perf_counter() - t0
    # Only a results file this run wrote counts (the folder may hold earlier runs').
    started = time.time() - wall
    results = sorted((p for p in out_dir.glob("run-*/results.json")
                      if p.stat().st_mtime >= started), key=lambda p: p.stat().st_mtime)
    report: dict = {"nodes": nodes, "run_config": run_config, "exit_code": proc.returncode,
                    "wall_s": wall, "peak_rss_bytes": peak, "peak_pss_bytes": peak_pss,
                    # where the memory was: per role at the peak, and each role's own peak
                    "peak_rss_by_role": dict(sorted(at_peak.items(), key=lambda kv: -kv[1])),
                    "role_peak_rss": dict(sorted(role_peaks.items(), key=lambda kv: -kv[1])),
                    "timeline_mb": timeline,
                    "output_tail": output[-2000:]}
    if results:
        res = json.loads(results[-1].read_text())
        report.update({
            "accepted": len(res["nodes"]), "rejected": len(res["rejected"]),
            "good_enough": res.get("verification", {}).get("good_enough"),
            # the nodes that ran their own check of h_G in the evaluate round
            "answered": res.get("verification", {}).get("answered"),
            "attendance": (res.get("attendance") or {}).get("line"),
            "gems_accuracy": res["rows"]["GEMS"].get("accuracy"),
            "timing_s": res.get("timing_s"),
            "rounds": [{k: r.get(k) for k in ("round", "layer", "width", "bytes_sent",
                                               "bytes_received", "wall_s")}
                       for r in res.get("rounds", [])],
            # the sites whose verdict rested on more than their few validation rows
            "verdicts_on_all_rows": [
                {k: n.get(k) for k in ("name", "num_train", "num_val", "verdict_rows",
                                       "h_g_val_accuracy", "h_g_verdict_accuracy",
                                       "good_enough")}
                for n in res["nodes"] if n.get("verdict_rows")],
        })
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100])
    parser.add_argument("--run-config", default="dataset='fashion-mnist' "
                        "label-division='classes-per-node:2'")
    parser.add_argument("--cpus-per-node", type=int, default=1,
                        help="gems-fl run's --cpus-per-node (2 on two cores: one ClientApp "
                        "actor; GEMS_FL_THREADS sets its threads)")
    parser.add_argument("--out", default=default_out("scale"))
    args = parser.parse_args()
    machine = {"cores": os.cpu_count(), "loadavg_before": os.getloadavg()}
    reports = []
    for n in args.nodes:
        out_dir = Path(args.out).parent / f"scale-runs-{n}"
        reports.append(run(n, args.run_config, out_dir, args.cpus_per_node))
    machine["loadavg_after"] = os.getloadavg()
    print(f"machine: {machine}")
    print("| nodes | exit | wall s | peak RSS MB | accepted | rejected | good enough | GEMS |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in reports:
        print(f"| {r['nodes']} | {r['exit_code']} | {r['wall_s']:.0f} | "
              f"{r['peak_rss_bytes'] / 2**20:.0f} | {r.get('accepted')} | {r.get('rejected')} | "
              f"{r.get('good_enough')} | {r.get('gems_accuracy')} |")
        if r.get("timing_s"):
            print(f"    time: {timing_line(r['timing_s'])}")
        if r.get("peak_pss_bytes"):
            print(f"    peak PSS (shared pages counted once): {r['peak_pss_bytes'] / 2**20:.0f} MB")
        if r.get("peak_rss_by_role"):
            print("    at the peak: " + ", ".join(f"{k} {v / 2**20:.0f} MB"
                                                   for k, v in r["peak_rss_by_role"].items()))
        for rd in r.get("rounds", []):
            print(f"    round {rd}")
    write_envelope("scale", args.out, {"machine": machine, "runs": reports},
                   settings={"run-config": args.run_config, "cpus-per-node": args.cpus_per_node,
                             "GEMS_FL_THREADS": os.environ.get("GEMS_FL_THREADS", "")})


if __name__ == "__main__":
    main()
