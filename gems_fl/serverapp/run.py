"""The ServerApp's run: settings -> identity round -> GEMS protocol -> verification on
the nodes -> baselines -> results on disk.

:func:`run_server` does the steps every run shares; :func:`run_convex` and
:func:`run_layerwise` each run one protocol and hand back a :class:`ProtocolRun`,
which :func:`finish` turns into the results (table, ``results.json``, the model).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from gems_fl.data import parse_division
from gems_fl.data.agreement import NODE_FILES, DataAgreement
from gems_fl.evaluation.baselines import (
    Candidates,
    evaluate_rows,
    row_names,
    skipped_rows,
    tune_on_public,
)
from gems_fl.evaluation.fine_tuning import fine_tuning_curve
from gems_fl.evaluation.local_models import (
    average_models,
    first_layer_matches,
    reproduce_local_models,
)
from gems_fl.evaluation.results import (
    MODEL_FILE,
    RESULTS_FILE,
    print_results,
    write_results,
)
from gems_fl.evaluation.results_bundle import bundle_lines
from gems_fl.evaluation.server_data import (
    ServerData,
    load_public_data,
    load_server_data,
    scale_server_data,
)
from gems_fl.geometry.eps import zero_radius_reason
from gems_fl.geometry.gram_sums import complete_membership
from gems_fl.geometry.spaces import SummedGramSpace
from gems_fl.learning.models import (
    MLP,
    build_model,
    model_from_vector,
    param_shapes,
    vector_to_state,
)
from gems_fl.learning.train import accuracy, set_default_device
from gems_fl.protocol.attendance import (
    ModelNotGoodEnough,
    RequiredNodesMissing,
    attendance,
    expected_line,
    missing_before_training,
)
from gems_fl.protocol.layerwise import LayerwiseGEMS
from gems_fl.protocol.local_models import collect_local_mlps
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.replies import NotEnoughRepliesError, dedupe_rejections
from gems_fl.protocol.roster import Roster, identify_nodes
from gems_fl.protocol.selection_round import result_at
from gems_fl.protocol.strategy import GEMS
from gems_fl.protocol.verify import GEMS_KEY, Verification, verify_on_nodes
from gems_fl.serverapp.preflight import preflight
from gems_fl.serverapp.protocol_run import ProtocolRun
from gems_fl.serverapp.report import (
    keyed_by_name,
    layerwise_refinement_report,
    node_table,
    privacy_record,
    refinement_report,
)
from gems_fl.serverapp.window import WindowedGrid
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.options import agreement_rule, exchange, node_config, server_options
from gems_fl.settings.plan import RunPlan, build_plan
from gems_fl.settings.values import parse_required_nodes, required_good_enough

NODE_WAIT_S = 60.0
# Every node scores every node's Local model while there are at most this many nodes:
# above it the evaluate round's downlink (N + 2 models to each of N nodes) grows as N^2.
MAX_LOCALS_SENT = 20
NO_SERVER_DATA = "evaluate-on-server=false: the server holds no training, test or public data"


def plan_line(plan: RunPlan) -> str:
    """The plan in one log line: the point(s), the reply's form, what the server keeps."""
    point = (plan.points[0] if len(plan.points) == 1 else
             f"the selection round chooses among {', '.join(plan.points)}") if plan.points \
        else f"{plan.space} spaces"
    form = ("" if plan.layer_size is None or plan.space != "gram" else
            f"; Gram replies {'whole' if plan.gram_rank == 0 else f'rank {plan.gram_rank}'}"
            f"{', with class Gram matrices' if plan.class_grams is True else ''}")
    return (f"{plan.model} on {plan.nodes} nodes: {point}{form}; the server holds "
            f"{plan.server_holds}; comparison rows: {plan.baselines}")


def wait_for_nodes(grid: Grid, minimum: int, timeout: float = NODE_WAIT_S) -> list[int]:
    """Node ids once at least ``minimum`` nodes are connected (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= minimum or time.monotonic() > deadline:
            return node_ids
        time.sleep(1.0)


def assemble_mlp(
    layers: list[tuple[np.ndarray, np.ndarray]], output: np.ndarray, num_features: int,
    num_classes: int, settings: Settings,
) -> MLP:
    """The aggregated MLP: merged hidden layers and the aggregated output layer."""
    model = build_model("mlp", num_features, num_classes, [w.shape[0] for w, _ in layers],
                        settings.dropout)
    state = {}
    for i, (weight, bias) in enumerate(layers):
        state[f"hidden.{i}.weight"] = torch.as_tensor(weight, dtype=torch.float32)
        state[f"hidden.{i}.bias"] = torch.as_tensor(bias, dtype=torch.float32)
    out = vector_to_state(output, layers[-1][0].shape[0], num_classes)
    state["output.weight"] = torch.as_tensor(out["weight"], dtype=torch.float32)
    state["output.bias"] = torch.as_tensor(out["bias"], dtype=torch.float32)
    model.load_state_dict(state)
    return model


def _extra_config(roster: Roster) -> dict[str, Any]:
    return roster.agreement.to_config() if roster.agreement is not None else {}


def run_convex(grid: Grid, settings: Settings, options: ServerOptions, roster: Roster,
               num_features: int, num_classes: int,
               test_accuracy: Callable[[np.ndarray], float] | None = None) -> ProtocolRun:
    """The convex protocol: one round of spaces, ``h_G`` from them, then ``refine-rounds``
    refinement rounds (``test_accuracy`` scores the model after each round, if given)."""
    strategy = GEMS(options, param_shapes(num_features, num_classes),
                    participants=roster.participants, names=roster.names,
                    extra_config=_extra_config(roster))
    scores: dict[int, float] = {}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round < 1 or test_accuracy is None:
            return None
        scores[server_round] = test_accuracy(strategy.point)
        return MetricRecord({"test-accuracy": scores[server_round]})

    strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=strategy.num_rounds,
                   timeout=options.round_timeout, evaluate_fn=evaluate)
    outcome = strategy.outcome
    point = strategy.point  # h_G, refined when refine-rounds > 0
    if settings.refine_rounds:  # membership, distances: of the refined model
        chosen = outcome.intersection
        outcome.intersection = result_at([r.space for r in outcome.accepted], point,
                                         chosen.method, {**chosen.details, "refined": True})
    centers = {roster.names.get(r.node_id, str(r.node_id)): r.space.center for r in outcome.accepted
               if r.space.center is not None}  # none under secure aggregation
    as_model = lambda v: model_from_vector(v, num_features, num_classes)
    node_models = {GEMS_KEY: vector_to_state(point, num_features, num_classes)}
    average = np.mean(list(centers.values()), axis=0) if centers else None
    if average is not None:
        node_models["averaged"] = vector_to_state(average, num_features, num_classes)
    if len(centers) <= MAX_LOCALS_SENT:
        node_models.update({f"local.{name}": vector_to_state(c, num_features, num_classes)
                            for name, c in centers.items()})
    else:
        log(INFO, "Verify: %d nodes, so the nodes score h_G and Averaged only (each Local "
            "model on every node would send %d models to each)", len(centers), len(centers) + 2)
    extra = {}
    if strategy.selects:
        extra["refinement"] = refinement_report(strategy.rounds, scores)
    return ProtocolRun(
        gems_model=as_model(point), model_state=vector_to_state(point, num_features, num_classes),
        outcome=outcome, rounds=strategy.rounds, rejected=outcome.rejected,
        node_models=node_models,
        local_models={name: as_model(c) for name, c in centers.items()},
        averaged=None if average is None else as_model(average), extra=extra,
    )


def run_layerwise(grid: Grid, settings: Settings, options: ServerOptions, roster: Roster,
                  num_features: int, num_classes: int,
                  test_accuracy: Callable[[nn.Module], float] | None = None) -> ProtocolRun:
    """The layer-wise protocol: one round per hidden layer, then the output layer, then
    the selection round and ``refine-rounds`` steps on the output layer where they run
    (``test_accuracy`` scores the MLP after each of those rounds, if given)."""
    strategy = LayerwiseGEMS(options, num_features, num_classes,
                             participants=roster.participants, names=roster.names,
                             extra_config=_extra_config(roster))
    scores: dict[int, float] = {}
    as_mlp = lambda point: assemble_mlp(strategy.layers, point, num_features,
                                        num_classes, settings)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round <= len(strategy.widths) or test_accuracy is None or strategy.point is None:
            return None
        scores[server_round] = test_accuracy(as_mlp(strategy.point))
        return MetricRecord({"test-accuracy": scores[server_round]})

    strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=strategy.num_rounds,
                   timeout=options.round_timeout, evaluate_fn=evaluate)
    outcome = strategy.outcome
    model = as_mlp(strategy.point)
    extra = {}
    if strategy.selects:
        extra["refinement"] = layerwise_refinement_report(strategy.round_reports(), scores)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return ProtocolRun(
        gems_model=model, model_state=state, outcome=outcome, rounds=strategy.round_reports(),
        rejected=[item for r in strategy.rounds for item in r.rejected],
        node_models={GEMS_KEY: state},
        extra={**extra, "excluded_nodes": {str(k): v for k, v in strategy.excluded.items()},
               "hidden_widths": [w.shape[0] for w, _ in strategy.layers],
               "first_layer_centers": strategy.first_layer_centers},
    )


def rebuild_local_mlps(run: ProtocolRun, data: ServerData, settings: Settings,
                       roster: Roster, num_classes: int) -> None:
    """The MLP's Local, Averaged and Ensemble rows need each node's whole local model,
    which the protocol never sends: in simulation the server retrains them."""
    log(INFO, "Retraining each node's local MLP on the server for the Local, Averaged and "
        "Ensemble rows")
    models = reproduce_local_models(settings, data.node_parts, num_classes)
    by_partition = {int(src.rsplit(" of ", 1)[0].split()[-1]): roster.names[n]
                    for n, src in roster.sources.items() if src.startswith("partition ")}
    run.local_models = {by_partition.get(k, f"partition-{k}"): m for k, m in enumerate(models)}
    run.averaged = average_models(models)
    run.extra["local_models_match_sent_layers"] = first_layer_matches(
        models, run.extra["first_layer_centers"])


def ask_local_mlps(grid: Grid, run: ProtocolRun, roster: Roster, settings: Settings,
                   options: ServerOptions, num_features: int, num_classes: int) -> None:
    """Without server data: each accepted node's whole local MLP, for the node-side Local
    and Averaged rows (:mod:`gems_fl.protocol.local_models`)."""
    shapes = {k: tuple(v.shape) for k, v in build_model(
        "mlp", num_features, num_classes, settings.hidden_widths, settings.dropout
    ).state_dict().items()}
    ids = [r.node_id for r in run.outcome.accepted]
    got = collect_local_mlps(grid, ids, roster.names,
                             {**options.exchange.node_config, **_extra_config(roster)}, shapes,
                             options.round_timeout)
    run.extra["local_models"] = {**got.report, "rejected": got.rejected}
    if not got.states:
        return
    models = {}
    for name, state in got.states.items():
        model = build_model("mlp", num_features, num_classes, settings.hidden_widths,
                            settings.dropout)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        models[name] = model
    run.local_models = models
    run.averaged = average_models(list(models.values()))
    sent = run.extra.get("first_layer_centers") or []
    run.extra["local_models_match_sent_layers"] = (  # the same models the nodes' round 1 had
        first_layer_matches(list(models.values()), sent) if len(sent) == len(models) else None)
    as_state = lambda m: {k: v.detach().numpy() for k, v in m.state_dict().items()}
    run.node_models["averaged"] = as_state(run.averaged)
    if len(models) <= MAX_LOCALS_SENT:
        run.node_models.update({f"local.{name}": as_state(m) for name, m in models.items()})


def load_server_side(
    settings: Settings, agreement: DataAgreement, num_nodes: int
) -> tuple[ServerData | None, Any, dict[str, Any], list[str]]:
    """What the server holds for the baselines: its copy of the partitions' data (in
    simulation), the ``public-data`` file, and the dataset's description for the results.

    Returns ``(server_data or None, public or None, meta, notes)``.
    """
    num_features, num_classes = agreement.num_features, agreement.num_classes
    meta: dict[str, Any] = {"name": settings.dataset, "num_nodes": num_nodes,
                            "num_features": num_features, "num_classes": num_classes,
                            "classes": list(agreement.classes),
                            "standardize": settings.standardize}
    if agreement.mean is not None:
        meta["scale"] = agreement.to_json()["scale"]
    notes: list[str] = []
    server_data = None
    public = None
    if settings.public_data.strip():
        public = load_public_data(settings, agreement)
        meta["public_data"] = {"path": settings.public_data, "samples": int(len(public.y)),
                               "test": int(len(public.test_y))}
    if settings.evaluate_on_server and settings.dataset == NODE_FILES:
        server_data = public.as_server_data(num_classes)
    elif settings.evaluate_on_server:
        # The label division describes the partition nodes, whose data the server copies.
        division = parse_division(settings.label_division, num_nodes, num_classes)
        log(INFO, "Loading %s on the server (pooled train for Global, test set, public "
            "sample)", settings.dataset)
        server_data, loaded, notes = load_server_data(settings, division)
        meta = {**loaded, **{k: v for k, v in meta.items() if k not in loaded}}
        scale_server_data(server_data, agreement, settings)
        if public is not None:
            server_data.public_x, server_data.public_y = public.x, public.y
    return server_data, public, meta, notes


def run_server(grid: Grid, context: Context) -> dict[str, Any]:
    """Run GEMS (convex, or layer-wise for ``model='mlp'``), write the results, return them."""
    started = time.time()
    t0 = time.perf_counter()
    try:
        settings = Settings.from_run_config(context.run_config)
    except SettingsError as exc:
        raise SettingsError(f"invalid run setting: {exc}") from None
    preflight(settings, check_data=settings.evaluate_on_server)
    deployed = is_deployed(grid)
    if in_simulation(grid):  # Flower's engine sweeps every stored message per node
        grid = WindowedGrid(grid)
    set_default_device(settings.device)  # training on the server: Global, tuning, Raw
    t_wait = time.perf_counter()
    wanted = parse_required_nodes(settings.required_nodes)
    expected = wanted if isinstance(wanted, int) else len(wanted) if wanted else 0
    node_ids = wait_for_nodes(grid, max(settings.min_replies, expected), settings.site_wait)
    waited = time.perf_counter() - t_wait
    roster = identify_nodes(grid, node_ids, exchange(settings), agreement_rule(settings))
    missing = missing_before_training(roster.present(), roster.participants, roster.names,
                                      roster.rejected, wanted, waited)
    if missing:
        stop_before_training(context, settings, roster, missing, started)
    if len(node_ids) < settings.min_replies:
        raise RuntimeError(f"only {len(node_ids)} nodes connected; min-replies={settings.min_replies}")
    if len(roster.participants) < settings.min_replies or roster.agreement is None:
        reasons = "; ".join(f"node {r.get('node_name', r['node_id'])}: {r['reason']}"
                            for r in roster.rejected)
        raise NotEnoughRepliesError(
            f"only {len(roster.participants)} of {len(node_ids)} nodes have data that fits the "
            f"run; min-replies={settings.min_replies}. Rejected: {reasons}")
    agreement = roster.agreement
    num_features, num_classes = agreement.num_features, agreement.num_classes
    num_nodes = len(roster.participants)
    plan = build_plan(settings, num_nodes, num_features)
    log(INFO, "Plan: %s", plan_line(plan))
    options = server_options(settings, plan, node_config(settings, plan))
    t_data = time.perf_counter()
    server_data, public, meta, notes = load_server_side(settings, agreement, num_nodes)
    for note in notes:
        log(WARNING, note)
    timing = {"wait_for_nodes": waited, "identify": float(roster.report.get("wall_s", 0.0)),
              "server_data": time.perf_counter() - t_data}

    t_round = time.perf_counter()
    if settings.model == "mlp":
        run = run_layerwise(grid, settings, options, roster, num_features, num_classes,
                            None if server_data is None else
                            lambda m: accuracy(m, server_data.test_x, server_data.test_y))
    else:
        run = run_convex(grid, settings, options, roster, num_features, num_classes,
                         _test_accuracy(server_data, num_features, num_classes))
    timing["rounds"] = time.perf_counter() - t_round

    if public is not None and server_data is None and settings.baselines == "all":
        run.node_models.update(tune_on_public(run, public, settings, num_features, num_classes))
    if settings.model == "mlp" and server_data is None and settings.baselines != "none":
        ask_local_mlps(grid, run, roster, settings, options, num_features, num_classes)
    t_verify = time.perf_counter()
    accepted_ids = [r.node_id for r in run.outcome.accepted]
    verification = verify_on_nodes(grid, accepted_ids, roster.names,
                                   {**options.exchange.node_config, **_extra_config(roster)},
                                   run.node_models, options.round_timeout,
                                   own_spaces=own_spaces(run, settings, num_features, num_classes))
    if holds_only_sums(run):  # the nodes' own checks are the membership there is
        run.outcome.intersection = complete_membership(
            run.outcome.intersection, [r.space for r in run.outcome.accepted],
            [(verification.checks[r.node_id].space if r.node_id in verification.checks
              else None) for r in run.outcome.accepted])
    timing["verify"] = time.perf_counter() - t_verify
    t_base = time.perf_counter()
    rows = evaluate_baselines(run, server_data, settings, roster, num_features, num_classes)
    timing["baselines"] = time.perf_counter() - t_base
    run.extra["plan"] = plan.to_dict()
    return finish(context, settings, run, roster, verification, rows, meta, notes,
                  timing=timing, started=started, t0=t0, send_home=deployed)


def stop_before_training(context: Context, settings: Settings, roster: Roster,
                         missing: list[tuple[str, str]], started: float) -> None:
    """A required site is missing or was rejected at the identity round: write results
    that say so (status ``incomplete``, no model) and stop before any training."""
    wanted = settings.required_nodes
    expected = ("every site present" if wanted == "all" else
                f"{wanted} site(s)" if str(wanted).strip().isdigit() else wanted)
    heard = sorted(roster.present().values())
    line = expected_line(f"{expected} (required-nodes={wanted!r})", heard, missing)
    results = {
        "status": "incomplete", "stage": "identity",
        "attendance": {"line": line, "ok": False, "required": wanted, "heard_from": heard,
                       "missing_required": [name for name, _ in missing],
                       "left_out": [{"name": n, "stage": "identity", "reason": why}
                                    for n, why in missing]},
        "run_id": int(context.run_id), "settings": settings.to_config(),
        "rejected": roster.rejected, "identify": roster.report,
    }
    folder = Path(settings.output_dir).expanduser().resolve() / f"run-{context.run_id}"
    write_results(results, folder, None, started_at=started)
    log(ERROR, "Sites: %s", line)
    raise RequiredNodesMissing(f"{line} (nothing trained; results written with status "
                               "'incomplete'; set required-nodes to a count or names to accept "
                               "fewer)")


def own_spaces(run: ProtocolRun, settings: Settings, num_features: int, num_classes: int
               ) -> dict[int, tuple[dict[str, np.ndarray], float]] | None:
    """For the convex model's Gram spaces: every accepted node's own center and radius,
    which the evaluate round sends back so that the node checks h_G against its space."""
    if settings.model != "logistic" or settings.space != "gram":
        return None
    return {r.node_id: (None if r.space.center is None else  # secure: the space it kept
                        (vector_to_state(r.space.center, num_features, num_classes),
                         r.space.radius)) for r in run.outcome.accepted}


def holds_only_sums(run: ProtocolRun) -> bool:
    """Whether the server kept only the sums of the nodes' Gram statistics."""
    return any(isinstance(r.space, SummedGramSpace) for r in run.outcome.accepted)


def in_simulation(grid: Grid) -> bool:
    """Flower's simulation engine (its in-memory grid)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return isinstance(grid, InMemoryGrid)


def is_deployed(grid: Grid) -> bool:
    """A SuperLink's grid in a deployment (not Flower's simulation, not in-process): the
    results are on another machine than the one that submitted the run."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from gems_fl.protocol.inprocess import InProcessGrid

    return not isinstance(grid, (InMemoryGrid, InProcessGrid))


def _test_accuracy(data: ServerData | None, num_features: int,
                   num_classes: int) -> Callable[[np.ndarray], float] | None:
    """Test accuracy of a logistic model given as a vector, as the GEMS row scores it
    (None without a server test set)."""
    if data is None:
        return None
    return lambda v: accuracy(model_from_vector(v, num_features, num_classes), data.test_x,
                              data.test_y)


def evaluate_baselines(run: ProtocolRun, data: ServerData | None, settings: Settings,
                       roster: Roster, num_features: int, num_classes: int) -> dict[str, Any]:
    """The results table's rows, on the server's test set (or skipped without data)."""
    layerwise = settings.model == "mlp"
    if data is None:
        reason = NO_SERVER_DATA
        if settings.public_data.strip() and settings.baselines == "all":
            reason = ("evaluate-on-server=false: no server test set; GEMS tuned and Raw (trained "
                      "on public-data) are evaluated on the nodes, see node_evaluation")
        return skipped_rows(reason, row_names(layerwise, settings.baselines))
    if layerwise and settings.baselines != "none":
        rebuild_local_mlps(run, data, settings, roster, num_classes)
    log(INFO, "Evaluating %s on the test set (baselines='%s')",
        ", ".join(row_names(layerwise, settings.baselines)), settings.baselines)
    rows = evaluate_rows(Candidates(run.gems_model, run.local_models, run.averaged,
                                    ensemble=layerwise), data, settings)
    if settings.tune_sizes:
        run.extra["fine_tuning"] = fine_tuning_curve(
            run.gems_model, list(run.local_models.values()), run.averaged,
            lambda: settings.new_model(num_features, num_classes),
            (data.pool_x, data.pool_y), (data.test_x, data.test_y), settings)
    return rows


def finish(context: Context, settings: Settings, run: ProtocolRun, roster: Roster,
           verification: Verification, rows: dict[str, Any], meta: dict[str, Any],
           notes: list[str], *, timing: dict[str, float], started: float,
           t0: float, send_home: bool = False) -> dict[str, Any]:
    """Assemble the results, print the tables, write ``results.json`` and the model
    (``send_home``: also print both into the run's log for the submitting machine,
    :mod:`gems_fl.evaluation.results_bundle`)."""
    for reply in run.outcome.accepted:
        if reply.space.radius == 0.0:
            reason = zero_radius_reason(reply.metrics["local-val-accuracy"],
                                        reply.metrics.get("eps", settings.eps))
            notes.append(f"node {roster.names.get(reply.node_id, reply.node_id)}: radius 0: "
                         f"{reason}")
    run.extra.pop("first_layer_centers", None)
    names = [roster.names.get(r.node_id, str(r.node_id)) for r in run.outcome.accepted]
    timing["total"] = time.perf_counter() - t0
    sites = attendance(roster.present(), roster.rejected, run.rejected, verification.missing,
                       settings.required_nodes, parse_required_nodes(settings.required_nodes))
    good, took_part = verification.to_dict()["good_enough"], len(verification.checks)
    needed = required_good_enough(settings.min_good_enough, took_part)
    useful = good >= needed
    verdict = (f"h_G is good enough on {good} of {took_part} site(s) that checked it; "
               f"min-good-enough={settings.min_good_enough} asks for {needed}")
    results = {
        "status": "completed" if sites.ok and useful else
        "incomplete" if not sites.ok else "not-good-enough",
        "attendance": sites.to_dict(),
        "good_enough": {"sites": good, "checked": took_part, "required": needed,
                        "ok": useful, "line": verdict},
        "run_id": int(context.run_id),
        "settings": settings.to_config(),
        "dataset": meta,
        "rows": rows,
        "intersection": keyed_by_name(run.outcome.intersection.to_dict(), names),
        "nodes": node_table(run, roster, verification, settings),
        "verification": verification.to_dict(),
        "rejected": dedupe_rejections(roster.rejected + run.rejected),
        "participants": roster.nodes_json({int(r["node_id"]) for r in run.rejected}),
        "identify": roster.report,
        "notes": notes,
        "privacy": privacy_record(settings, holds_only_sums(run)),
        "rounds": run.rounds,
        "timing_s": timing,
        "started_unix": started,
        **run.extra,
    }
    folder = Path(settings.output_dir).expanduser().resolve() / f"run-{context.run_id}"
    results["output"] = {"results": str(folder / RESULTS_FILE), "model": str(folder / MODEL_FILE)}
    path = write_results(results, folder, run.model_state, started_at=started)
    print_results(results)
    log(INFO, "Results written to %s (model: %s) on the machine running the ServerApp",
        path, folder / MODEL_FILE)
    if send_home:
        files = {RESULTS_FILE: path, MODEL_FILE: folder / MODEL_FILE}
        for line in bundle_lines(int(context.run_id), {k: v for k, v in files.items() if v.is_file()}):
            print(line, flush=True)
        log(INFO, "Results sent home in the run's log (gems-fl submit and gems-fl pull write "
            "them on the submitting machine)")
    if not sites.ok:
        log(ERROR, "Sites: %s", sites.line)
        raise RequiredNodesMissing(f"{sites.line} (results written with status 'incomplete'; "
                                   "set required-nodes to a count or names to accept fewer)")
    log(INFO, "Sites: %s", sites.line)
    if not useful:
        log(ERROR, "Not good enough: %s", verdict)
        raise ModelNotGoodEnough(f"{verdict} (results written with status 'not-good-enough'; "
                                 "see each site's figures in the table above)")
    return results
