"""How a run ends: the results assembled (:func:`report`), printed and written
(``results.json`` and the model: :func:`publish`), the sites' attendance and the
good-enough verdict, and the exit that goes with them (:func:`conclude`); or, when a
required site is missing at the identity round, results that say so and a stop before
any training (:func:`stop_before_training`). A run that writes no files
(:func:`gems_fl.fitting.fit`) gets the same results and model back as a
:class:`RunOutcome`, or on the exception that stops it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common.logger import log

from gems_fl.data.agreement import NODE_FILES, Scaling
from gems_fl.evaluation.results import (
    MODEL_FILE,
    RESULTS_FILE,
    complete_results,
    print_results,
    rows_from_sites,
    write_results,
)
from gems_fl.evaluation.results_bundle import bundle_lines
from gems_fl.geometry.eps import zero_radius_reason
from gems_fl.protocol.attendance import (
    ModelNotGoodEnough,
    RequiredNodesMissing,
    attendance,
    expected_line,
)
from gems_fl.protocol.replies import dedupe_rejections
from gems_fl.protocol.roster import Roster
from gems_fl.protocol.verify import Verification
from gems_fl.serverapp.protocol_run import ProtocolRun
from gems_fl.serverapp.report import (
    keyed_by_name,
    node_table,
    privacy_record,
)
from gems_fl.settings import PrivacySettings, Settings
from gems_fl.settings.options import dp_spec
from gems_fl.settings.values import parse_required_nodes, required_good_enough


@dataclass(frozen=True)
class RunOutcome:
    """What a run ends with: its ``results`` (what ``results.json`` holds) and
    ``model_state``, ``h_G``'s arrays as the model file holds them (None where nothing was
    trained)."""

    results: dict[str, Any]
    model_state: dict[str, Any] | None


def stop_before_training(context: Context, settings: Settings, roster: Roster,
                         missing: list[tuple[str, str]], wanted: int | tuple[str, ...] | None,
                         started: float, send_home: bool = False, write: bool = True) -> None:
    """A required site is missing or was rejected at the identity round (``wanted``: the
    parsed ``required-nodes``): write results that say so (status ``incomplete``, no model;
    ``send_home``: also into the run's log, as :func:`publish` does; ``write=False``: only
    on the exception) and stop before any training."""
    heard = sorted(roster.present().values())
    line = expected_line(settings.required_nodes, wanted, heard, missing)
    results = {
        "status": "incomplete", "stage": "identity",
        "attendance": {"line": line, "ok": False, "required": settings.required_nodes,
                       "heard_from": heard,
                       "missing_required": [name for name, _ in missing],
                       "left_out": [{"name": n, "stage": "identity", "reason": why}
                                    for n, why in missing]},
        "run_id": int(context.run_id), "settings": settings.to_config(),
        "rejected": roster.rejected, "identify": roster.report,
    }
    if write:
        path = write_results(results, run_folder(settings.output_dir, int(context.run_id)),
                             None, started_at=started)
        if send_home:
            _send_home(int(context.run_id), {RESULTS_FILE: path})
    else:
        complete_results(results, started)
    log(ERROR, "Sites: %s", line)
    raise RequiredNodesMissing(f"{line} (nothing trained; results {_kept(write)} with status "
                               "'incomplete'; set required-nodes to a count or names to accept "
                               "fewer)", results)


def report(run_id: int, settings: Settings, run: ProtocolRun, roster: Roster,
           verification: Verification, rows: dict[str, Any], meta: dict[str, Any],
           notes: list[str], *, timing: dict[str, float], started: float,
           t0: float) -> RunOutcome:
    """The report stage: the results of a run (attendance, the good-enough verdict, the
    tables' rows, the nodes, the rounds) and the model's arrays, assembled; nothing is
    printed or written (:func:`publish`, :func:`conclude`) and nothing is sent."""
    notes.extend(_result_notes(run, roster, meta, settings.eps, unscaled=(
        settings.dataset == NODE_FILES and settings.standardize == Scaling.OFF)))
    run.extra.pop("first_layer_centers", None)
    names = [roster.names.get(r.node_id, str(r.node_id)) for r in run.outcome.accepted]
    timing["total"] = time.perf_counter() - t0
    sites = attendance(roster.present(), roster.rejected, run.rejected, verification.missing,
                       settings.required_nodes, parse_required_nodes(settings.required_nodes))
    good_enough = _good_enough(settings.min_good_enough, verification)
    results = {
        "status": "completed" if sites.ok and good_enough["ok"] else
        "incomplete" if not sites.ok else "not-good-enough",
        "attendance": sites.to_dict(),
        "good_enough": good_enough,
        "run_id": int(run_id),
        "settings": settings.to_config(),
        "dataset": meta,
        "rows": rows_from_sites(rows, verification.to_dict()),
        "intersection": keyed_by_name(run.outcome.intersection.to_dict(), names),
        "nodes": node_table(run, roster, verification, settings.eps),
        "verification": verification.to_dict(),
        "rejected": dedupe_rejections(roster.rejected + run.rejected),
        "participants": roster.nodes_json({int(r["node_id"]) for r in run.rejected}),
        "identify": roster.report,
        "notes": notes,
        "privacy": privacy_record(settings.part(PrivacySettings), dp_spec(settings),
                                  run.holds_only_sums),
        "rounds": run.rounds,
        "timing_s": timing,
        "started_unix": started,
        **run.extra,
    }
    return RunOutcome(results, _model_state(run, roster))


def publish(outcome: RunOutcome, folder: Path | None, *, send_home: bool = False) -> None:
    """Print the results' tables and write ``results.json`` and the model into ``folder``
    (``None``: write nothing; the results are completed in place all the same, as
    :func:`~gems_fl.evaluation.results.complete_results` completes them; ``send_home``:
    also print both into the run's log for the submitting machine,
    :mod:`gems_fl.evaluation.results_bundle`)."""
    results, started = outcome.results, outcome.results.get("started_unix")
    if folder is None:
        complete_results(results, started)
        print_results(results)
        return
    results["output"] = {"results": str(folder / RESULTS_FILE), "model": str(folder / MODEL_FILE)}
    path = write_results(results, folder, outcome.model_state, started_at=started)
    print_results(results)
    log(INFO, "Results written to %s (model: %s) on the machine running the ServerApp",
        path, folder / MODEL_FILE)
    if send_home:
        _send_home(int(results["run_id"]), {RESULTS_FILE: path, MODEL_FILE: folder / MODEL_FILE})


def run_folder(output_dir: str, run_id: int) -> Path:
    """Where a run writes its results: ``<output-dir>/run-<run id>``."""
    return Path(output_dir).expanduser().resolve() / f"run-{run_id}"


def _good_enough(min_good_enough: str, verification: Verification) -> dict[str, Any]:
    """On how many sites ``h_G`` was good enough, against what ``min-good-enough`` asks."""
    good, took_part = verification.to_dict()["good_enough"], len(verification.checks)
    needed = required_good_enough(min_good_enough, took_part)
    verdict = (f"h_G is good enough on {good} of {took_part} site(s) that checked it; "
               f"min-good-enough={min_good_enough} asks for {needed}")
    return {"sites": good, "checked": took_part, "required": needed, "ok": good >= needed,
            "line": verdict}


def _model_state(run: ProtocolRun, roster: Roster) -> dict[str, Any] | None:
    """What the model file holds: the weights, and the feature map that travels with them."""
    state = run.model_state
    features = roster.agreement.features if roster.agreement is not None else None
    if state is not None and features is not None:
        state = {**state, **features.arrays()}
    return state


def _result_notes(run: ProtocolRun, roster: Roster, meta: dict[str, Any], eps: float, *,
                  unscaled: bool) -> list[str]:
    """What the results add about the sites' verdicts: why a radius is 0, and an eps that
    asks no more than chance (``eps``: the run's, for a site that did not report its own;
    ``unscaled``: the sites' own columns, not standardized)."""
    notes: list[str] = []
    for reply in run.outcome.accepted:
        if reply.space.radius == 0.0:
            reason = zero_radius_reason(reply.metrics["local-val-accuracy"],
                                        reply.metrics.get("eps", eps), unscaled=unscaled)
            notes.append(f"node {roster.names.get(reply.node_id, reply.node_id)}: radius 0: "
                         f"{reason}")
    chance = 1.0 / max(len(meta.get("classes") or []) or meta.get("num_classes", 0), 1)
    low = sorted({float(r.metrics.get("eps", eps)) for r in run.outcome.accepted
                  if float(r.metrics.get("eps", eps)) <= chance})
    if low:
        notes.append(f"eps={', '.join(f'{e:g}' for e in low)} asks no more than chance of h_G "
                     f"({chance:.2g} for {round(1 / chance)} classes), so every verdict is easy: "
                     "set eps to the accuracy the sites require (docs/own-data.md, choosing eps)")
    return notes


def conclude(outcome: RunOutcome, *, written: bool) -> None:
    """Log the attendance and the verdict the results record; raise, with the ``outcome``,
    where a required site is missing or ``h_G`` was good enough on too few sites (the
    results are ``written`` by then, or not at all)."""
    sites, good_enough = outcome.results["attendance"], outcome.results["good_enough"]
    if not sites["ok"]:
        log(ERROR, "Sites: %s", sites["line"])
        raise RequiredNodesMissing(f"{sites['line']} (results {_kept(written)} with status "
                                   "'incomplete'; set required-nodes to a count or names to "
                                   "accept fewer)", outcome.results, outcome.model_state)
    log(INFO, "Sites: %s; %s", sites["line"], sites["roll"])
    if not good_enough["ok"]:
        log(ERROR, "Not good enough: %s", good_enough["line"])
        raise ModelNotGoodEnough(f"{good_enough['line']} (results {_kept(written)} with status "
                                 "'not-good-enough'; see each site's figures in the table "
                                 "above)", outcome.results, outcome.model_state)


def _kept(written: bool) -> str:
    return "written" if written else "kept on the exception"


def _send_home(run_id: int, files: dict[str, Path]) -> None:
    """Print the files into the run's log: the channel back to the submitting machine."""
    for line in bundle_lines(run_id, {k: v for k, v in files.items() if v.is_file()}):
        print(line, flush=True)
    log(INFO, "Results sent home in the run's log (gems-fl submit and gems-fl pull write "
        "them on the submitting machine)")
