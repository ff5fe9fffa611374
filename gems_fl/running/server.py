"""The ServerApp's work: settings -> GEMS round -> baselines -> results on disk."""

from __future__ import annotations

import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.evaluation.baselines import (
    NN_ROW_NAMES,
    ServerData,
    draw_public_sample,
    evaluate_rows,
    skipped_rows,
)
from gems_fl.evaluation.baselines_nn import (
    average_models,
    evaluate_nn_rows,
    first_layer_matches,
    reproduce_local_models,
)
from gems_fl.evaluation.fine_tuning import fine_tuning_curve
from gems_fl.protocol.layerwise import LayerwiseGEMS
from gems_fl.data import DATASET_SHAPES, FeatureOptions, load_dataset, node_data, parse_division
from gems_fl.learning.models import MLP, build_model, model_from_vector, param_shapes, vector_to_state
from gems_fl.evaluation.results import MODEL_FILE, RESULTS_FILE, print_results, write_results
from gems_fl.protocol.roster import identify_nodes
from gems_fl.settings import Settings, SettingsError
from gems_fl.protocol.strategy import GEMS, NotEnoughRepliesError

NODE_WAIT_S = 60.0


def wait_for_nodes(grid: Grid, minimum: int, timeout: float = NODE_WAIT_S) -> list[int]:
    """Node ids once at least ``minimum`` nodes are connected (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= minimum or time.monotonic() > deadline:
            return node_ids
        time.sleep(1.0)


def pooled_in_canonical_order(parts: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """All nodes' training rows pooled, in an order that does not depend on the division.

    Global is "trained on all the nodes' data". Sorting the pool by a fixed projection of
    each row makes it the same model for every K whose nodes hold the same samples, as
    in the paper's tables, instead of one that changes with the partitions' order. Rows
    that tie are identical, so their relative order cannot change the training.
    """
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    direction = np.random.default_rng(20_240_611).standard_normal(x.shape[1])
    order = np.lexsort((y, x.astype(np.float64) @ direction))
    return x[order], y[order]


def load_server_data(
    settings: Settings, division: list[list[int]]
) -> tuple[ServerData, dict[str, Any], list[str]]:
    """What a simulation's server holds: pooled train (Global), test, public sample."""
    splits = load_dataset(settings.dataset, seed=settings.seed, data_dir=settings.data_dir or None,
                          features=FeatureOptions.from_settings(settings))
    num_nodes = len(division)
    parts = [node_data(splits, division, k, settings.seed) for k in range(num_nodes)]
    notes = []
    size = settings.public_samples
    if size > len(splits.public_y):
        notes.append(f"public-samples={size} but {settings.dataset}'s public pool holds "
                     f"{len(splits.public_y)} samples no node uses; using all of them")
        size = len(splits.public_y)
    public_x, public_y = draw_public_sample(splits.public_x, splits.public_y, size, settings.seed)
    train_x, train_y = pooled_in_canonical_order(parts)
    data = ServerData(
        train_x=train_x, train_y=train_y,
        test_x=splits.test_x, test_y=splits.test_y,
        public_x=public_x, public_y=public_y, num_classes=splits.num_classes,
        node_parts=parts, pool_x=splits.public_x, pool_y=splits.public_y,
    )
    meta = {
        "name": settings.dataset, "num_nodes": num_nodes, "label_division": division,
        "num_features": splits.num_features, "num_classes": splits.num_classes,
        "node_train_total": int(len(data.train_y)),
        "node_val_total": int(sum(len(p[3]) for p in parts)),
        "test": int(len(splits.test_y)), "public_pool": int(len(splits.public_y)),
        "public_used": int(size),
    }
    return data, meta, notes


def assemble_mlp(
    layers: list[tuple[np.ndarray, np.ndarray]], output: np.ndarray, num_features: int,
    num_classes: int, settings: Settings,
) -> MLP:
    """The aggregated MLP: merged hidden layers and the intersected output layer."""
    model = MLP(num_features, [w.shape[0] for w, _ in layers], num_classes, settings.dropout)
    state = {}
    for i, (weight, bias) in enumerate(layers):
        state[f"hidden.{i}.weight"] = torch.as_tensor(weight, dtype=torch.float32)
        state[f"hidden.{i}.bias"] = torch.as_tensor(bias, dtype=torch.float32)
    out = vector_to_state(output, layers[-1][0].shape[0], num_classes)
    state["output.weight"] = torch.as_tensor(out["weight"], dtype=torch.float32)
    state["output.bias"] = torch.as_tensor(out["bias"], dtype=torch.float32)
    model.load_state_dict(state)
    return model


def run_server(grid: Grid, context: Context) -> dict[str, Any]:
    """Run GEMS (convex, or layer-wise for ``model='mlp'``), write the results, return them."""
    t0 = time.perf_counter()
    try:
        settings = Settings.from_run_config(context.run_config)
    except SettingsError as exc:
        raise SettingsError(f"invalid run setting: {exc}") from None
    node_ids = wait_for_nodes(grid, settings.min_replies)
    if len(node_ids) < settings.min_replies:
        raise RuntimeError(f"only {len(node_ids)} nodes connected; min-replies={settings.min_replies}")
    num_features, num_classes = DATASET_SHAPES[settings.dataset]
    roster = identify_nodes(grid, node_ids, settings, num_features, num_classes)
    if len(roster.participants) < settings.min_replies:
        reasons = "; ".join(f"node {r['node_id']}: {r['reason']}" for r in roster.rejected)
        raise NotEnoughRepliesError(
            f"only {len(roster.participants)} of {len(node_ids)} nodes have data that fits the "
            f"run; min-replies={settings.min_replies}. Rejected: {reasons}")
    # The label division only describes partition nodes (and the server's own copy of
    # their data); nodes with their own data-path ignore it.
    num_nodes = len(roster.participants)
    try:
        division = parse_division(settings.label_division, num_nodes, num_classes)
    except ValueError:
        if settings.evaluate_on_server:
            raise
        division = None
    notes: list[str] = []
    server_data = None
    if settings.evaluate_on_server:
        log(INFO, "Loading %s on the server (pooled train for Global, test set, public "
            "sample)", settings.dataset)
        server_data, meta, notes = load_server_data(settings, division)
    else:
        meta = {"name": settings.dataset, "num_nodes": num_nodes, "label_division": division,
                "num_features": num_features, "num_classes": num_classes}
    for note in notes:
        log(WARNING, note)

    layerwise = settings.model == "mlp"
    if layerwise:
        strategy = LayerwiseGEMS(settings, num_features, num_classes,
                                 participants=roster.participants, names=roster.names)
    else:
        strategy = GEMS(settings, param_shapes(num_features, num_classes),
                        participants=roster.participants, names=roster.names)
    t_round = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(),
                   num_rounds=strategy.num_rounds if layerwise else 1,
                   timeout=settings.round_timeout)
    round_s = time.perf_counter() - t_round
    outcome = strategy.outcome
    inter = outcome.intersection
    extra: dict[str, Any] = {}
    skip_reason = "evaluate-on-server=false: the server holds no training, test or public data"
    if layerwise:
        gems_model = assemble_mlp(strategy.layers, inter.point, num_features, num_classes, settings)
        model_state = {k: v.detach().numpy() for k, v in gems_model.state_dict().items()}
        extra["rounds"] = strategy.round_reports()
        round_rejections = [item for r in strategy.rounds for item in r.rejected]
        extra["excluded_nodes"] = {str(k): v for k, v in strategy.excluded.items()}
        extra["hidden_widths"] = [w.shape[0] for w, _ in strategy.layers]
        if server_data is not None:
            log(INFO, "Retraining each node's local MLP on the server for the Local, "
                "Averaged and Ensemble rows")
            local_models = reproduce_local_models(settings, server_data.node_parts, num_classes)
            extra["local_models_match_sent_layers"] = first_layer_matches(
                local_models, strategy.first_layer_centers)
            rows = evaluate_nn_rows(local_models, gems_model, server_data, settings)
            if settings.tune_sizes:
                extra["fine_tuning"] = fine_tuning_curve(
                    gems_model, local_models, average_models(local_models),
                    lambda: MLP(num_features, settings.hidden_widths, num_classes, settings.dropout),
                    (server_data.pool_x, server_data.pool_y),
                    (server_data.test_x, server_data.test_y), settings)
        else:
            rows = skipped_rows(skip_reason, NN_ROW_NAMES)
    else:
        model_state = vector_to_state(inter.point, num_features, num_classes)
        if server_data is not None:
            log(INFO, "Evaluating Global, Local, Averaged, GEMS, GEMS tuned and Raw on the test set")
            centers = [r.space.center for r in outcome.accepted]
            rows = evaluate_rows(centers, inter.point, server_data, settings)
            if settings.tune_sizes:
                as_model = lambda v: model_from_vector(v, num_features, num_classes)  # noqa: E731
                extra["fine_tuning"] = fine_tuning_curve(
                    as_model(inter.point), [as_model(c) for c in centers],
                    as_model(np.mean(centers, axis=0)),
                    lambda: build_model(settings.model, num_features, num_classes),
                    (server_data.pool_x, server_data.pool_y),
                    (server_data.test_x, server_data.test_y), settings)
        else:
            rows = skipped_rows(skip_reason)
        extra["rounds"] = strategy.rounds
        round_rejections = outcome.rejected
    for reply in outcome.accepted:
        if reply.space.radius == 0.0:
            notes.append(f"node {reply.node_id}: local validation accuracy "
                         f"{reply.metrics['local-val-accuracy']:.3f} < eps={settings.eps}, "
                         "radius 0; lower eps to give it room")
    results = {
        "status": "completed",
        "run_id": int(context.run_id),
        "settings": settings.to_config(),
        "dataset": meta,
        "rows": rows,
        "intersection": inter.to_dict(),
        "nodes": [
            {"node_id": int(r.node_id), "name": roster.names.get(r.node_id, ""),
             "radius": r.space.radius,
             "local_val_accuracy": r.metrics["local-val-accuracy"],
             "num_train": int(r.metrics["num-train-examples"]),
             "num_val": int(r.metrics["num-val-examples"]),
             "inside": bool(inside), "miss": float(miss)}
            for r, inside, miss in zip(outcome.accepted, inter.inside, inter.miss)
        ],
        "rejected": roster.rejected + round_rejections,
        "participants": roster.nodes_json(),
        "identify": roster.report,
        "notes": notes,
        "timing_s": {"round": round_s, "total": time.perf_counter() - t0},
        **extra,
    }
    folder = Path(settings.output_dir).expanduser().resolve() / f"run-{context.run_id}"
    results["output"] = {"results": str(folder / RESULTS_FILE), "model": str(folder / MODEL_FILE)}
    path = write_results(results, folder, model_state)
    print_results(results)
    log(INFO, "Results written to %s (model: %s) on the machine running the ServerApp",
        path, folder / MODEL_FILE)
    return results
