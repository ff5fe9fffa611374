"""Run the trials of a plan: in worker processes, with a progress bar, resumable.

Each trial runs the real apps in-process (see :mod:`gems_fl.protocol.inprocess`): GEMS trials
call :func:`gems_fl.serverapp.run_server`, the function ``server_app.py`` calls, with an
in-process Grid whose nodes run :func:`gems_fl.clientapp.build_client_app`, the
ClientApp ``client_app.py`` serves; FedAvg/FedProx trials use :mod:`gems_lab.fedavg`. A trial's
outcome is stored (:mod:`.store`: one JSON Lines file per study under ``trials/``) as soon
as it finishes, so an interrupted
reproduction resumes where it stopped, and a finished trial is never run twice. Each
outcome records the git commit of the code that computed it (``git_commit``,
``git_dirty``): a reproduction that spans several invocations says which code each
trial ran.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from gems_fl.evaluation.results import RESULTS_FILE, git_commit
from gems_fl.learning.train_cache import ENV_VAR as CACHE_ENV_VAR
from gems_lab.reproduce.plan import Trial
from gems_lab.reproduce.store import TrialStore


def _compact_gems(results: dict, exchanges: list[dict]) -> dict:
    rows = {name: {k: v for k, v in row.items() if k in ("accuracy", "parameters", "hidden_widths",
                                                         "skipped", "fresh", "tuned_layers")}
            for name, row in results["rows"].items()}
    rounds = [e for e in exchanges if e["nodes"] > 0 and e["type"] == "train"]
    other = [e for e in exchanges if e["nodes"] > 0 and e["type"] != "train"]
    verification = results.get("verification") or {}
    inter = results["intersection"]
    return {
        "space": results["settings"].get("space"),
        "gram_rank": results["settings"].get("gram-rank"),
        # h_G good enough on how many nodes, as the nodes report it (their own check)
        "verification": {k: verification.get(k) for k in ("answered", "good_enough")},
        "inside": inter.get("inside"),
        "method": inter.get("method"),
        # mean over nodes of what each sent up in the protocol's rounds (not the check)
        "bytes_up_per_node": float(sum(e["up"] / e["nodes"] for e in rounds)),
        "rows": rows,
        "intersection_found": bool(results["intersection"]["found"]),
        "hidden_widths": results.get("hidden_widths"),
        "fine_tuning": results.get("fine_tuning"),
        "refinement": results.get("refinement"),  # per round: test accuracy, bytes so far
        "bytes_per_round": rounds,
        "bytes_other": other,  # the server's identity check before round 1
        "radii": [n["radius"] for n in results["nodes"]],
        "notes": results["notes"],
        "seconds": results["timing_s"]["total"],
    }


def execute(trial: Trial, work_dir: str) -> dict:
    """Run one trial and return its compact outcome (runs inside a worker process)."""
    from flwr.app import Context, RecordDict

    from gems_fl.clientapp import build_client_app
    from gems_fl.evaluation.results import RESULTS_FILE
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp import run_server
    from gems_lab.fedavg import run_federated, run_sgd

    t0 = time.perf_counter()
    log_path = Path(work_dir) / "logs" / f"{trial.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        handler = logging.StreamHandler(log)
        flwr_logger = logging.getLogger("flwr")
        saved = flwr_logger.handlers[:]
        flwr_logger.handlers = [handler]
        try:
            if trial.kind == "gems":
                cfg = {**trial.run_config, "output-dir": str(Path(work_dir) / "runs" / trial.name)}
                grid = InProcessGrid(build_client_app(), trial.num_nodes, cfg,
                                     node_configs=trial.node_configs)
                ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                              run_config=cfg)
                run_server(grid, ctx)
                written = Path(cfg["output-dir"]) / f"run-{ctx.run_id}" / RESULTS_FILE
                outcome = _compact_gems(json.loads(written.read_text()), grid.exchanges)
            elif trial.federated.get("optimizer") == "sgd":
                fed = trial.federated
                curve = run_sgd(trial.run_config, trial.num_nodes, trial.kind, fed["rounds"],
                                fed["local_epochs"], fed["proximal_mu"], tuple(fed["lr_grid"]),
                                fed["tune_rounds"])
                outcome = curve.to_dict()
            else:
                curve = run_federated(trial.run_config, trial.num_nodes, trial.kind,
                                      trial.federated["rounds"], trial.federated["local_epochs"],
                                      trial.federated["proximal_mu"])
                outcome = curve.to_dict()
        finally:
            flwr_logger.handlers = saved
    git = git_commit()
    return {"kind": trial.kind, "labels": trial.labels, "studies": sorted(trial.studies),
            "run_config": trial.run_config, "num_nodes": trial.num_nodes,
            "node_configs": trial.node_configs, "federated": trial.federated,
            "outcome": outcome, "wall_s": time.perf_counter() - t0,
            "git_commit": git["commit"] if git else None,
            "git_dirty": git["dirty"] if git else None}


def _with_commit(record: dict, run_dir: Path) -> dict:
    """A stored outcome from before trials recorded their commit takes it from its GEMS
    run's own ``results.json`` (``run.git_commit``) when that is still on disk."""
    written = run_dir / "run-1" / RESULTS_FILE
    try:
        run = json.loads(written.read_text()).get("run") or {}
    except (OSError, ValueError):
        return record
    if run.get("git_commit"):
        record = {**record, "git_commit": run["git_commit"], "git_dirty": run.get("git_dirty")}
    return record


def _next_trial(queue: list[Trial], running) -> Trial | None:
    """Pop the first queued trial whose seed no running trial has.

    Two trials of one seed share their expensive trainings through the cache; run at the
    same time, both would compute them. None means: wait for a running trial to finish.
    """
    busy = {t.seed for t in running}
    for i, trial in enumerate(queue):
        if trial.seed not in busy:
            return queue.pop(i)
    return None if busy else queue.pop(0)


def run_trials(trials: list[Trial], work_dir: Path, jobs: int) -> tuple[list[dict], int]:  # noqa: C901
    """Run every trial not yet on disk (``jobs`` at a time).

    Returns all outcomes in plan order and how many trials this call actually ran.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV_VAR] = str(work_dir / "cache")  # inherited by the workers
    store = TrialStore(work_dir)
    stored_records = store.load()
    changed = False
    done: dict[str, dict] = {}
    for trial in trials:
        if trial.name in stored_records:
            stored = stored_records[trial.name]
            if "git_commit" not in stored:
                stored = _with_commit(stored, work_dir / "runs" / trial.name)
                if "git_commit" in stored:  # kept, for a checkout without the runs
                    stored_records[trial.name] = stored
                    changed = True
            # This plan's studies and labels: a label an earlier plan stored (a rank of a
            # sweep this one skips) is not this report's.
            stored = {**stored, "studies": sorted(trial.studies), "labels": dict(trial.labels)}
            done[trial.name] = stored
    if changed or store.has_legacy_files:
        store.write_all(stored_records)
    todo = [t for t in trials if t.name not in done]
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[last]}"))
    with Progress(*columns) as progress:
        task = progress.add_task("trials", total=len(trials), completed=len(done), last="")
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
            pending = {}
            queue = list(todo)
            while queue or pending:
                while queue and len(pending) < max(1, jobs):
                    trial = _next_trial(queue, pending.values())
                    if trial is None:
                        break
                    pending[pool.submit(execute, trial, str(work_dir))] = trial
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    trial = pending.pop(future)
                    try:
                        record = future.result()
                    except Exception as exc:
                        raise RuntimeError(
                            f"trial {trial.name} ({trial.kind}, {trial.labels}) failed: {exc}; "
                            f"its log is {work_dir / 'logs' / (trial.name + '.log')}") from exc
                    store.add(trial.name, record)
                    done[trial.name] = record
                    line = f"{trial.kind} {trial.labels} {record['wall_s']:.1f}s"
                    progress.update(task, advance=1, last=line)
                    if not progress.console.is_terminal:  # a log file still shows progress
                        progress.console.print(f"[{len(done)}/{len(trials)}] {line}")
    return [done[t.name] for t in trials], len(todo)
