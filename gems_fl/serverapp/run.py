"""The ServerApp's run: settings -> identity round -> GEMS protocol -> verification on
the nodes -> baselines -> results on disk.

:func:`run_server` runs the stages, each handing the next a typed value: identify
(:class:`Roster`), plan (:func:`plan_stage`: :class:`Planned`, nothing sent), the rounds
(:func:`rounds_stage`: spaces, then the selection round and the refinement steps where the
plan runs them, through :mod:`gems_fl.serverapp.protocols`: a :class:`ProtocolRun`),
verify (:func:`verify_stage`: :class:`Verification`), the baselines' rows, and report
(:func:`gems_fl.serverapp.finish.report`: a :class:`RunOutcome`, nothing sent), which
:func:`~gems_fl.serverapp.finish.publish` prints and writes and
:func:`~gems_fl.serverapp.finish.conclude` turns into the run's exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.data import parse_division
from gems_fl.data.agreement import NODE_FILES, DataAgreement, Scaling
from gems_fl.evaluation.baselines import (
    Candidates,
    evaluate_rows,
    row_names,
    skipped_rows,
    tune_on_public,
)
from gems_fl.evaluation.server_data import (
    ServerData,
    load_public_data,
    load_server_data,
    public_map_rows,
    scale_server_data,
)
from gems_fl.extensions import StudyInputs, study
from gems_fl.geometry.choices import kind_traits
from gems_fl.geometry.gram_sums import complete_membership
from gems_fl.heap import return_freed_blocks
from gems_fl.learning.models import (
    model_from_vector,
    vector_to_state,
)
from gems_fl.learning.train import accuracy, set_default_device
from gems_fl.protocol.attendance import (
    missing_before_training,
)
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.replies import NotEnoughRepliesError
from gems_fl.protocol.roster import Roster, identify_nodes
from gems_fl.protocol.verify import Verification, verify_on_nodes
from gems_fl.serverapp.finish import (
    RunOutcome,
    conclude,
    publish,
    report,
    run_folder,
    stop_before_training,
)
from gems_fl.serverapp.preflight import preflight
from gems_fl.serverapp.protocol_run import ProtocolRun
from gems_fl.serverapp.protocols import (
    ask_local_mlps,
    extra_config,
    rebuild_local_mlps,
    run_convex,
    run_layerwise,
)
from gems_fl.serverapp.window import SIMULATION_WINDOW, WindowedGrid
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.operation import Baselines
from gems_fl.settings.options import (
    agreement_rule,
    comparison_options,
    exchange,
    server_data_options,
    server_options,
)
from gems_fl.settings.plan import RunPlan, build_plan
from gems_fl.settings.values import parse_required_nodes

return_freed_blocks()  # the ServerApp's process folds reply after reply into its sums

NODE_WAIT_S = 60.0
NO_SERVER_DATA = "evaluate-on-server=false: the server holds no training, test or public data"


def plan_line(plan: RunPlan) -> str:
    """The plan in one log line: the point(s), the reply's form, what the server keeps."""
    point = (plan.points[0] if len(plan.points) == 1 else
             f"the selection round chooses among {', '.join(plan.points)}") if plan.points \
        else f"{plan.space} spaces"
    if plan.column_points:
        point += f" (and the logistic model's {', '.join(plan.column_points)} on the rows' columns)"
    form = ("" if plan.layer_size is None or not kind_traits(plan.space).statistics else
            f"; Gram replies {'whole' if plan.gram_rank == 0 else f'rank {plan.gram_rank}'}"
            f"{', with class Gram matrices' if plan.class_grams is True else ''}")
    model = f"{plan.model} ({plan.features})" if plan.features else plan.model
    return (f"{model} on {plan.nodes} nodes: {point}{form}; the server holds "
            f"{plan.server_holds}; comparison rows: {plan.baselines}")


def wait_for_nodes(grid: Grid, minimum: int, timeout: float = NODE_WAIT_S) -> list[int]:
    """Node ids once at least ``minimum`` nodes are connected (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= minimum or time.monotonic() > deadline:
            return node_ids
        time.sleep(1.0)


def registered_names(grid: Grid) -> dict[int, str]:
    """``{node id: name}`` of the connected SuperNodes the operator registered by name
    (SuperNode authentication: ``flwr supernode register KEY LINK --name NAME``); empty
    without authentication and in simulation."""
    return {int(n.node_id): str(n.name) for n in grid.get_nodes() if getattr(n, "name", "")}


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
    if agreement.columns is not None:
        meta["columns"] = list(agreement.columns)
    if agreement.categories:
        meta["categories"] = {k: list(v) for k, v in agreement.categories.items()}
    if agreement.features is not None:
        meta[agreement.features.JSON_KEY] = agreement.features.to_json()
    notes: list[str] = []
    if settings.dataset == NODE_FILES and settings.dp_epsilon and settings.standardize == Scaling.OFF:
        notes.append("dp-epsilon on the sites' own files: the features are not scaled (the "
                     "federated scaling's sums would leave the sites unnoised); scale the files "
                     "beforehand, to ranges known without the rows, if their features are on "
                     "different scales")
    server_data = None
    public = None
    if settings.public_data.strip():
        public = load_public_data(server_data_options(settings), agreement)
        meta["public_data"] = {"path": settings.public_data, "samples": int(len(public.y)),
                               "test": int(len(public.test_y))}
    if settings.evaluate_on_server and settings.dataset == NODE_FILES:
        server_data = public.as_server_data(num_classes)
    elif settings.evaluate_on_server:
        # The label division describes the partition nodes, whose data the server copies.
        division = parse_division(settings.label_division, num_nodes, num_classes)
        log(INFO, "Loading %s on the server (pooled train for Global, test set, public "
            "sample)", settings.dataset)
        options = server_data_options(settings)
        server_data, loaded, notes = load_server_data(options, division)
        meta = {**loaded, **{k: v for k, v in meta.items() if k not in loaded}}
        scale_server_data(server_data, agreement, options)
        if public is not None:
            server_data.public_x, server_data.public_y = public.x, public.y
    return server_data, public, meta, notes


def run_server(grid: Grid, context: Context) -> dict[str, Any]:
    """Run GEMS (convex, or layer-wise for ``model='mlp'``), write the results, return them.

    The stages: settings and preflight, the sites (waited for and identified), training
    (again with the sites that remain where some leave), the local baselines the run asks
    for, the sites' own checks of ``h_G``, the server's baselines, the report."""
    return _run(grid, context, write=True).results


def run_without_files(grid: Grid, context: Context) -> RunOutcome:
    """:func:`run_server` that writes nothing (no ``output-dir``): the results and the
    model's arrays come back, or on the exception that stops the run
    (:class:`~gems_fl.protocol.attendance.RunStopped`)."""
    return _run(grid, context, write=False)


def _run(grid: Grid, context: Context, *, write: bool) -> RunOutcome:
    started = time.time()
    t0 = time.perf_counter()
    try:
        settings = Settings.from_run_config(context.run_config)
    except SettingsError as exc:
        raise SettingsError(f"invalid run setting: {exc}") from None
    preflight(settings, check_data=settings.evaluate_on_server, writes=write)
    deployed = is_deployed(grid)
    if (in_simulation(grid) or deployed) and not isinstance(grid, WindowedGrid):
        # replies handed on as they arrive; in a simulation, a window of messages in
        # flight (in process: the grid's own way)
        grid = WindowedGrid(grid, None if deployed else SIMULATION_WINDOW)
    set_default_device(settings.device)  # training on the server: Global, tuning, Raw
    roster, waited = _identified_sites(grid, context, settings, started, deployed, write)
    timing = {"wait_for_nodes": waited, "identify": float(roster.report.get("wall_s", 0.0)),
              "server_data": 0.0, "rounds": 0.0}
    attempt, roster = _train_to_the_end(roster, partial(_train, grid, settings, timing=timing))
    run, plan, options = attempt.run, attempt.planned.plan, attempt.planned.options
    server_data, public = attempt.server.data, attempt.server.public
    num_features, num_classes = roster.agreement.model_features, roster.agreement.num_classes
    if public is not None and server_data is None and settings.baselines == Baselines.ALL:
        run.node_models.update(tune_on_public(run, public, comparison_options(settings),
                                              num_features, num_classes))
    if settings.model_kind.layerwise and server_data is None and settings.baselines != Baselines.NONE:
        ask_local_mlps(grid, run, roster, options, num_features, num_classes, settings.dropout)
    t_verify = time.perf_counter()
    verification = verify_stage(grid, run, roster, options, send_own_spaces=(
        settings.model_kind.convex and settings.space_kind.statistics))
    timing["verify"] = time.perf_counter() - t_verify
    t_base = time.perf_counter()
    rows = evaluate_baselines(run, server_data, settings, roster, num_features, num_classes)
    timing["baselines"] = time.perf_counter() - t_base
    run.extra["plan"] = plan.to_dict()
    outcome = report(int(context.run_id), settings, run, roster, verification, rows,
                     attempt.server.meta, attempt.server.notes, timing=timing, started=started,
                     t0=t0)
    publish(outcome, run_folder(settings.output_dir, int(context.run_id)) if write else None,
            send_home=deployed)
    conclude(outcome, written=write)
    return outcome


def _identified_sites(grid: Grid, context: Context, settings: Settings, started: float,
                      deployed: bool, write: bool) -> tuple[Roster, float]:
    """Wait for the sites, identify them and agree on the data: ``(roster, seconds
    waited)``. A required site missing stops the run here (results written, nothing
    trained); too few sites that fit raise."""
    t_wait = time.perf_counter()
    wanted = parse_required_nodes(settings.required_nodes)
    expected = wanted if isinstance(wanted, int) else len(wanted) if wanted else 0
    node_ids = wait_for_nodes(grid, max(settings.min_replies, expected), settings.site_wait)
    waited = time.perf_counter() - t_wait
    rule = agreement_rule(settings)
    if settings.model_kind.map_from_rows and settings.dp_epsilon:  # the server's own rows
        rule = replace(rule, public_rows=partial(public_map_rows,
                                                 server_data_options(settings)))
    roster = identify_nodes(grid, node_ids, exchange(settings), rule, registered_names(grid))
    missing = missing_before_training(roster.present(), roster.participants, roster.names,
                                      roster.rejected, wanted, waited)
    if missing:
        stop_before_training(context, settings, roster, missing, wanted, started,
                             send_home=deployed, write=write)
    if len(node_ids) < settings.min_replies:
        raise RuntimeError(f"only {len(node_ids)} nodes connected; min-replies={settings.min_replies}")
    if len(roster.participants) < settings.min_replies or roster.agreement is None:
        reasons = "; ".join(f"node {r.get('node_name', r['node_id'])}: {r['reason']}"
                            for r in roster.rejected)
        raise NotEnoughRepliesError(
            f"only {len(roster.participants)} of {len(node_ids)} nodes have data that fits the "
            f"run; min-replies={settings.min_replies}. Rejected: {reasons}")
    return roster, waited


def _train_to_the_end(roster: Roster, train: Callable[[Roster], Attempt]
                      ) -> tuple[Attempt, Roster]:
    """``train`` the roster; where sites leave and the agreement of those that remain
    differs, train again with those alone. The last attempt (earlier ones recorded in its
    run) and the roster it ran with."""
    abandoned: list[dict[str, Any]] = []
    while True:
        attempt = train(roster)
        survivors = roster.after_losing(attempt.run.rejected)
        if survivors is None:
            break
        lost = sorted(set(roster.participants) - set(survivors.participants))
        log(WARNING, "Sites: %s left after the identity round; the agreement of the %d that "
            "remain differs (scaling, classes), so the rounds run again with those alone: the "
            "model depends only on the sites that take part to the end",
            ", ".join(roster.names[n] for n in lost), len(survivors.participants))
        abandoned.append({"lost": [roster.names[n] for n in lost], "rounds": attempt.run.rounds,
                          "rejected": attempt.run.rejected})
        roster = survivors
    if abandoned:  # their bytes were spent; the sites they lost stay left out
        attempt.run.extra["abandoned_attempts"] = abandoned
        attempt.run.rejected = [e for a in abandoned for e in a["rejected"]] + attempt.run.rejected
    return attempt, roster


def verify_stage(grid: Grid, run: ProtocolRun, roster: Roster, options: ServerOptions, *,
                 send_own_spaces: bool) -> Verification:
    """Each accepted site checks ``h_G`` (and the comparison models) on its own rows; where
    the server holds only the sums, those checks are the membership there is
    (``send_own_spaces``: the convex model's Gram spaces, each checked by its node)."""
    num_features, num_classes = roster.agreement.model_features, roster.agreement.num_classes
    accepted_ids = [r.node_id for r in run.outcome.accepted]
    verification = verify_on_nodes(grid, accepted_ids, roster.names,
                                   {**options.exchange.node_config, **extra_config(roster)},
                                   run.node_models, options.round_timeout,
                                   own_spaces=own_spaces(run, num_features, num_classes)
                                   if send_own_spaces else None)
    if run.holds_only_sums:
        run.outcome.intersection = complete_membership(
            run.outcome.intersection, [r.space for r in run.outcome.accepted],
            [(verification.checks[r.node_id].space if r.node_id in verification.checks
              else None) for r in run.outcome.accepted])
    return verification


@dataclass(frozen=True)
class Planned:
    """The plan stage's handoff to the rounds: the ``plan`` (every ``auto`` resolved, as
    ``results.json`` records it), the ``options`` the strategies read, and the model's
    shape: ``layerwise`` (the MLP's protocol, else the convex one) and the MLP's
    ``dropout``."""

    plan: RunPlan
    options: ServerOptions
    layerwise: bool
    dropout: float


@dataclass(frozen=True)
class ServerSide:
    """What the server holds beside the protocol: its copy of the partitions' data (in
    simulation; None without it), the ``public-data`` rows, the dataset's description for
    the results (``meta``) and notes for the user."""

    data: ServerData | None
    public: Any
    meta: dict[str, Any]
    notes: list[str]


@dataclass
class Attempt:
    """One pass of the protocol over a roster: what was planned, what the server holds,
    and the protocol's run."""

    run: ProtocolRun
    planned: Planned
    server: ServerSide


def plan_stage(settings: Settings, roster: Roster) -> Planned:
    """The plan of a run of ``settings`` over ``roster``'s participants and agreement, and
    the options the protocol takes from it; nothing is sent (no Flower needed)."""
    agreement = roster.agreement
    plan = build_plan(settings, len(roster.participants), agreement.model_features)
    if agreement.features is not None:
        plan = replace(plan, features=agreement.features.describe())
    options = server_options(settings, plan)
    if settings.model_kind.rows_beside and agreement.features is not None \
            and agreement.features.raw_columns:  # as the plan and the nodes ask the kind
        options = replace(options, aggregate=replace(
            options.aggregate, linear_columns=agreement.features.raw_columns))
    return Planned(plan, options, settings.model_kind.layerwise, settings.dropout)


def rounds_stage(grid: Grid, planned: Planned, roster: Roster,
                 server_data: ServerData | None) -> ProtocolRun:
    """The GEMS rounds the plan asks for: spaces (the MLP: one round per layer), then
    the selection round and the refinement steps where they run (scored after each
    round on the server's test set, where it holds one)."""
    agreement = roster.agreement
    num_features, num_classes = agreement.model_features, agreement.num_classes
    if planned.layerwise:
        return run_layerwise(grid, planned.options, roster, num_features, num_classes,
                             planned.dropout, None if server_data is None else
                             lambda m: accuracy(m, server_data.test_x, server_data.test_y))
    return run_convex(grid, planned.options, roster, num_features, num_classes,
                      _test_accuracy(server_data, num_features, num_classes))


def _train(grid: Grid, settings: Settings, roster: Roster, *, timing: dict[str, float]) -> Attempt:
    """The plan stage, the server's side and the rounds stage for ``roster`` (``timing``
    gains the time spent)."""
    planned = plan_stage(settings, roster)
    log(INFO, "Plan: %s", plan_line(planned.plan))
    t_data = time.perf_counter()
    server = ServerSide(*load_server_side(settings, roster.agreement,
                                          len(roster.participants)))
    for note in server.notes:
        log(WARNING, note)
    timing["server_data"] += time.perf_counter() - t_data
    t_round = time.perf_counter()
    run = rounds_stage(grid, planned, roster, server.data)
    timing["rounds"] += time.perf_counter() - t_round
    return Attempt(run, planned, server)


def own_spaces(run: ProtocolRun, num_features: int, num_classes: int
               ) -> dict[int, tuple[dict[str, np.ndarray], float] | None]:
    """Every accepted node's own center and radius (for the convex model's Gram spaces),
    which the evaluate round sends back so that the node checks h_G against its space."""
    return {r.node_id: (None if r.space.center is None else  # secure: the space it kept
                        (vector_to_state(r.space.center, num_features, num_classes),
                         r.space.radius)) for r in run.outcome.accepted}


def in_simulation(grid: Grid) -> bool:
    """Flower's simulation engine (its in-memory grid)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return isinstance(_beneath(grid), InMemoryGrid)


def is_deployed(grid: Grid) -> bool:
    """A SuperLink's grid in a deployment (not Flower's simulation, not in-process): the
    results are on another machine than the one that submitted the run."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from gems_fl.protocol.inprocess import InProcessGrid

    return not isinstance(_beneath(grid), (InMemoryGrid, InProcessGrid))


def _beneath(grid: Grid) -> Grid:
    """The grid a :class:`WindowedGrid` sends through (else ``grid``)."""
    return grid.grid if isinstance(grid, WindowedGrid) else grid


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
    layerwise = settings.model_kind.layerwise
    if data is None:
        reason = NO_SERVER_DATA
        if settings.public_data.strip() and settings.baselines == Baselines.ALL:
            reason = ("evaluate-on-server=false: no server test set; GEMS tuned and Raw (trained "
                      "on public-data) are evaluated on the nodes, see node_evaluation")
        return skipped_rows(reason, row_names(layerwise, settings.baselines))
    if layerwise and settings.baselines != Baselines.NONE:
        rebuild_local_mlps(run, data, settings.local_training, settings.seed, roster, num_classes)
    log(INFO, "Evaluating %s on the test set (baselines='%s')",
        ", ".join(row_names(layerwise, settings.baselines)), settings.baselines)
    rows = evaluate_rows(Candidates(run.gems_model, run.local_models, run.averaged,
                                    ensemble=layerwise), data, comparison_options(settings))
    if settings.tune_sizes:
        run.extra["fine_tuning"] = study("fine-tuning")(StudyInputs(
            run.gems_model, list(run.local_models.values()), run.averaged,
            lambda: settings.new_model(num_features, num_classes),
            (data.with_all_rows().pool_x, data.pool_y), (data.test_x, data.test_y),
            settings.to_config()))
    return rows


