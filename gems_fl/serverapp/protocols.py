"""The protocol runs the ServerApp drives: the convex protocol (:func:`run_convex`) and the
layer-wise one (:func:`run_layerwise`), each handing back a :class:`ProtocolRun`, and the
MLP's whole local models behind its Local, Averaged and Ensemble rows (retrained on the
server in simulation, asked of the nodes otherwise)."""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from gems_fl.evaluation.local_models import (
    average_models,
    first_layer_matches,
    reproduce_local_models,
)
from gems_fl.evaluation.server_data import (
    ServerData,
)
from gems_fl.learning.model_kinds import MLP_KIND
from gems_fl.learning.models import (
    MLP,
    build_model,
    model_from_vector,
    param_shapes,
    vector_to_state,
)
from gems_fl.learning.recipe import LocalTraining
from gems_fl.protocol.layerwise import LayerwiseGEMS
from gems_fl.protocol.local_models import collect_local_mlps
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.roster import Roster
from gems_fl.protocol.selection_round import result_at
from gems_fl.protocol.strategy import GEMS
from gems_fl.protocol.verify import GEMS_KEY
from gems_fl.serverapp.protocol_run import ProtocolRun
from gems_fl.serverapp.report import (
    layerwise_refinement_report,
    refinement_report,
)

# Every node scores every node's Local model while there are at most this many nodes:
# above it the evaluate round's downlink (N + 2 models to each of N nodes) grows as N^2.
MAX_LOCALS_SENT = 20


def extra_config(roster: Roster, first: bool = False) -> dict[str, Any]:
    """The agreement every message carries: whole in round 1 (``first``), the kernel map's
    landmarks by their hash after it (each node keeps them from round 1)."""
    return roster.agreement.to_config(whole=first) if roster.agreement is not None else {}


def assemble_mlp(
    layers: list[tuple[np.ndarray, np.ndarray]], output: np.ndarray, num_features: int,
    num_classes: int, dropout: float,
) -> MLP:
    """The aggregated MLP: merged hidden layers and the aggregated output layer."""
    model = build_model(MLP_KIND.name, num_features, num_classes, [w.shape[0] for w, _ in layers],
                        dropout)
    state = {}
    for i, (weight, bias) in enumerate(layers):
        state[f"hidden.{i}.weight"] = torch.as_tensor(weight, dtype=torch.float32)
        state[f"hidden.{i}.bias"] = torch.as_tensor(bias, dtype=torch.float32)
    out = vector_to_state(output, layers[-1][0].shape[0], num_classes)
    state["output.weight"] = torch.as_tensor(out["weight"], dtype=torch.float32)
    state["output.bias"] = torch.as_tensor(out["bias"], dtype=torch.float32)
    model.load_state_dict(state)
    return model


def run_convex(grid: Grid, options: ServerOptions, roster: Roster,
               num_features: int, num_classes: int,
               test_accuracy: Callable[[np.ndarray], float] | None = None) -> ProtocolRun:
    """The convex protocol: one round of spaces, ``h_G`` from them, then ``refine-rounds``
    refinement rounds (``test_accuracy`` scores the model after each round, if given)."""
    strategy = GEMS(options, param_shapes(num_features, num_classes),
                    participants=roster.participants, names=roster.names,
                    extra_config=extra_config(roster, first=True),
                    later_config=extra_config(roster))
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
    if options.refine_rounds:  # membership, distances: of the refined model
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


def run_layerwise(grid: Grid, options: ServerOptions, roster: Roster, num_features: int,
                  num_classes: int, dropout: float,
                  test_accuracy: Callable[[nn.Module], float] | None = None) -> ProtocolRun:
    """The layer-wise protocol: one round per hidden layer, then the output layer, then
    the selection round and ``refine-rounds`` steps on the output layer where they run
    (``test_accuracy`` scores the MLP after each of those rounds, if given; ``dropout``:
    the returned MLP's)."""
    strategy = LayerwiseGEMS(options, num_features, num_classes,
                             participants=roster.participants, names=roster.names,
                             extra_config=extra_config(roster))
    scores: dict[int, float] = {}
    as_mlp = lambda point: assemble_mlp(strategy.layers, point, num_features,
                                        num_classes, dropout)

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


def rebuild_local_mlps(run: ProtocolRun, data: ServerData, training: LocalTraining, seed: int,
                       roster: Roster, num_classes: int) -> None:
    """The MLP's Local, Averaged and Ensemble rows need each node's whole local model,
    which the protocol never sends: in simulation the server retrains them (with the
    nodes' ``training`` recipe and the run's ``seed``)."""
    log(INFO, "Retraining each node's local MLP on the server for the Local, Averaged and "
        "Ensemble rows")
    models = reproduce_local_models(training, seed,
                                    data.with_all_rows().node_parts, num_classes)
    by_partition = {int(src.rsplit(" of ", 1)[0].split()[-1]): roster.names[n]
                    for n, src in roster.sources.items() if src.startswith("partition ")}
    run.local_models = {by_partition.get(k, f"partition-{k}"): m for k, m in enumerate(models)}
    run.averaged = average_models(models)
    run.extra["local_models_match_sent_layers"] = first_layer_matches(
        models, run.extra["first_layer_centers"])


def ask_local_mlps(grid: Grid, run: ProtocolRun, roster: Roster, options: ServerOptions,
                   num_features: int, num_classes: int, dropout: float) -> None:
    """Without server data: each accepted node's whole local MLP, for the node-side Local
    and Averaged rows (:mod:`gems_fl.protocol.local_models`)."""
    shapes = {k: tuple(v.shape) for k, v in build_model(
        MLP_KIND.name, num_features, num_classes, list(options.hidden_widths), dropout
    ).state_dict().items()}
    ids = [r.node_id for r in run.outcome.accepted]
    got = collect_local_mlps(grid, ids, roster.names,
                             {**options.exchange.node_config, **extra_config(roster)}, shapes,
                             options.round_timeout)
    run.extra["local_models"] = {**got.report, "rejected": got.rejected}
    if not got.states:
        return
    models = {}
    for name, state in got.states.items():
        model = build_model(MLP_KIND.name, num_features, num_classes,
                            list(options.hidden_widths), dropout)
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
