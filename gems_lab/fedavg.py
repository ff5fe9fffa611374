"""FedAvg and FedProx baselines with Flower's own strategies, on GEMS's partitions.

The server side is :class:`flwr.serverapp.strategy.FedAvg` / ``FedProx`` unchanged; the
node side is :data:`fedavg_client_app`, which trains the received model for
``local-epochs`` epochs on exactly the data a GEMS node with the same node config trains
on (``gems_fl.data.nodes.load_node_data``: partition or own data file, and its seed), with the
same Adam recipe (a fresh optimiser each round) or, with ``optimizer="sgd"``, plain SGD
at a learning rate the server sends, adding FedProx's proximal term when the strategy
sends ``proximal-mu``. With ``model='random-features'`` the server derives the map as a
GEMS run's identity round does (``rf-bandwidth=auto``: from the pooled feature sums of
the nodes' training rows; the run's seed) and sends it in every round's config; each node
maps its rows with it, so both methods fit the same model. Accuracy is measured on the
server's test set after every round, next to the bytes of the records exchanged.

SGD's learning rate is chosen by :func:`choose_lr`: one short federated run per rate of
a small grid, each scored on a validation split the server holds (the nodes' validation
splits pooled, which a simulation's server can load, see
:func:`gems_fl.evaluation.server_data.load_server_data`; no node trains on them), never
on the test set. :func:`run_sgd` tunes, then runs the full curve at the chosen rate.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, FedProx
from torch import nn

from gems_fl.data import FeatureOptions, load_dataset, node_data, parse_division
from gems_fl.data.agreement import feature_map_from_config
from gems_fl.data.kernel_features import KernelFeatures, class_centres, mean_square_norm, row_scale
from gems_fl.data.nodes import cast_node_arrays, load_node_data
from gems_fl.data.random_features import RandomFeatures, bandwidth_from_stats
from gems_fl.data.site_files import feature_stats
from gems_fl.learning.model_kinds import KERNEL_KIND, model_kind
from gems_fl.learning.train import OPTIMIZERS, accuracy, fine_tune, set_default_device
from gems_fl.protocol.inprocess import InProcessGrid
from gems_fl.settings import Settings
from gems_fl.settings.options import node_data_options
from gems_fl.settings.values import parse_rf_bandwidth

STRATEGIES = ("fedavg", "fedprox")
SGD_LR_GRID = (0.01, 0.03, 0.1, 0.3)
EVALUATE_ON = ("test", "val")

fedavg_client_app = ClientApp()


def make_model(settings: Settings, num_features: int, num_classes: int) -> nn.Module:
    """The model GEMS uses for ``settings.model`` (logistic regression or the MLP)."""
    return settings.new_model(num_features, num_classes)


_MAPPED: dict[str, np.ndarray] = {}  # a node's mapped training rows, for its later rounds


def _mapped(data, features, node_config) -> np.ndarray:
    """``features`` of the node's training rows, mapped once per process and map."""
    key = json.dumps([dict(node_config), features.to_json()], sort_keys=True, default=str)
    if key not in _MAPPED:
        if len(_MAPPED) >= 32:
            _MAPPED.clear()
        _MAPPED[key] = features.transform(data.x_train)
    return _MAPPED[key]


@fedavg_client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's partition; reply with it and its size."""
    settings = Settings.from_run_config(context.run_config)
    set_default_device(settings.device)
    data = cast_node_arrays(load_node_data(node_data_options(settings), context.node_config))
    config = msg.content["config"]
    features = feature_map_from_config(config)
    x_train = data.x_train if features is None else _mapped(data, features, context.node_config)
    model = make_model(settings, x_train.shape[1], data.num_classes)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    round_index = int(config["server-round"])
    # Adam keeps the run's local-lr (the GEMS recipe); SGD gets the rate the server chose.
    lr = float(config["lr"]) if "lr" in config else settings.local_lr
    seed = data.seed + 7919 * round_index
    torch.manual_seed(seed)  # dropout draws from the global generator: same seed, same masks
    fine_tune(model, x_train, data.y_train, epochs=int(config["local-epochs"]),
              lr=lr, batch_size=settings.batch_size,
              seed=seed,
              proximal_mu=float(config.get("proximal-mu", 0.0)),
              optimizer=str(config.get("optimizer", "adam")))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(data.y_train)})})
    return Message(content=content, reply_to=msg)


@dataclass
class FederatedCurve:
    """Test accuracy after each round against the bytes exchanged so far."""

    strategy: str
    rounds: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)  # cumulative, server -> nodes
    bytes_up: list[int] = field(default_factory=list)  # cumulative, nodes -> server
    seconds: float = 0.0
    optimizer: str = "adam"
    lr: float | None = None  # SGD's rate; None: Adam at the run's local-lr
    tuning: dict | None = None  # SGD: the grid, its validation scores, the chosen rate

    @property
    def bytes_total(self) -> list[int]:
        return [d + u for d, u in zip(self.bytes_down, self.bytes_up)]

    def to_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "rounds": self.rounds, "accuracy": self.accuracy,
                "bytes_down": self.bytes_down, "bytes_up": self.bytes_up,
                "bytes_total": self.bytes_total, "seconds": self.seconds,
                "optimizer": self.optimizer, "lr": self.lr, "tuning": self.tuning}


def _node_parts(settings: Settings, num_nodes: int, splits) -> list[tuple[np.ndarray, ...]]:
    division = parse_division(settings.label_division, num_nodes, splits.num_classes)
    return [node_data(splits, division, k, settings.seed) for k in range(num_nodes)]


def pooled_validation(settings: Settings, num_nodes: int, splits) -> tuple[np.ndarray, np.ndarray]:
    """The nodes' validation splits pooled: what a simulation's server holds for choosing
    hyperparameters (``load_server_data``'s ``node_parts``), disjoint from every node's
    training rows and from the test set."""
    parts = _node_parts(settings, num_nodes, splits)
    return (np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))


_KERNEL_MAPS: dict[str, KernelFeatures] = {}


def _kernel_map(settings: Settings, parts, bandwidth: float, num_inputs: int) -> KernelFeatures:
    """The kernel map a GEMS run agrees on: each node's class centres, in node order."""
    share = int(settings.kernel_landmarks) / sum(len(p[1]) for p in parts)
    marks = np.concatenate([class_centres(p[0], p[1], share, int(settings.seed))[0]
                            for p in parts])
    scale = row_scale(mean_square_norm([feature_stats(p[0]) for p in parts], None, None),
                      num_inputs)
    return KernelFeatures(marks, bandwidth, raw_scale=scale)


def feature_map(settings: Settings, num_nodes: int, splits) -> RandomFeatures | KernelFeatures | None:
    """The feature map a GEMS run with these settings agrees on (None for the other
    models): ``rf-bandwidth`` as set, or from the nodes' pooled training sums; the kernel
    model's landmarks are the class centres its nodes would send, in their order."""
    kind = model_kind(settings.model)
    if kind.feature_map is None:
        return None
    parts = [p for p in _node_parts(settings, num_nodes, splits) if len(p[0])]
    bandwidth = parse_rf_bandwidth(settings.rf_bandwidth)
    if bandwidth is None:
        bandwidth = bandwidth_from_stats([feature_stats(p[0]) for p in parts])
    if kind is KERNEL_KIND:
        key = json.dumps([settings.to_config(), num_nodes, float(bandwidth)], sort_keys=True,
                         default=str)
        if key not in _KERNEL_MAPS:  # k-means on every node: once per settings
            _KERNEL_MAPS[key] = _kernel_map(settings, parts, float(bandwidth), splits.num_features)
        return _KERNEL_MAPS[key]
    return RandomFeatures(settings.rf_map, splits.num_features, int(settings.rf_dim),
                          float(bandwidth), int(settings.seed))


def run_federated(  # noqa: C901
    run_config: dict, num_nodes: int, strategy: str, num_rounds: int,
    local_epochs: int = 1, proximal_mu: float = 0.01,
    optimizer: str = "adam", lr: float | None = None, evaluate_on: str = "test",
) -> FederatedCurve:
    """``num_rounds`` of FedAvg or FedProx over ``num_nodes`` in-process nodes.

    ``optimizer="adam"`` trains locally with the run's Adam recipe (``local-lr``);
    ``optimizer="sgd"`` with plain SGD at ``lr``. ``evaluate_on="val"`` scores every round
    on the pooled validation split (:func:`pooled_validation`) instead of the test set:
    what :func:`choose_lr` uses.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    if evaluate_on not in EVALUATE_ON:
        raise ValueError(f"evaluate_on={evaluate_on!r} is not one of {', '.join(EVALUATE_ON)}")
    if optimizer == "sgd" and not (lr is not None and lr > 0):
        raise ValueError(f"optimizer='sgd' needs a learning rate lr > 0, got {lr!r}")
    if num_rounds < 1 or local_epochs < 1:
        raise ValueError("num_rounds and local_epochs must be >= 1")
    t0 = time.perf_counter()
    settings = Settings.from_run_config(run_config)
    splits = load_dataset(settings.dataset, seed=settings.seed, data_dir=settings.data_dir or None,
                          features=FeatureOptions.from_settings(settings))
    features = feature_map(settings, num_nodes, splits)
    width = splits.num_features if features is None else features.dim
    torch.manual_seed(settings.seed)
    initial = make_model(settings, width, splits.num_classes)
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=num_nodes,
                  min_available_nodes=num_nodes)
    chosen = (FedProx(proximal_mu=proximal_mu, **common) if strategy == "fedprox"
              else FedAvg(**common))
    grid = InProcessGrid(fedavg_client_app, num_nodes, run_config)
    probe = make_model(settings, width, splits.num_classes)

    if evaluate_on == "val":
        eval_x, eval_y = pooled_validation(settings, num_nodes, splits)
    else:
        eval_x, eval_y = splits.test_x, splits.test_y
    if features is not None:
        eval_x = features.transform(eval_x)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        probe.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy(probe, eval_x, eval_y)})

    train_config = {"local-epochs": local_epochs,
                    **(features.to_config() if features is not None else {})}
    if optimizer == "sgd":
        train_config.update({"optimizer": "sgd", "lr": float(lr)})
    result = chosen.start(
        grid=grid, initial_arrays=ArrayRecord(initial.state_dict()), num_rounds=num_rounds,
        train_config=ConfigRecord(train_config), evaluate_fn=evaluate,
    )
    curve = FederatedCurve(strategy=strategy, optimizer=optimizer,
                           lr=float(lr) if optimizer == "sgd" else None)
    down = up = 0
    train_exchanges = [e for e in grid.exchanges if e["nodes"] > 0]
    for r, exchange in enumerate(train_exchanges, start=1):
        down += exchange["down"]
        up += exchange["up"]
        curve.rounds.append(r)
        curve.accuracy.append(float(result.evaluate_metrics_serverapp[r]["accuracy"]))
        curve.bytes_down.append(down)
        curve.bytes_up.append(up)
    curve.seconds = time.perf_counter() - t0
    return curve


@dataclass
class LrChoice:
    """The learning rate :func:`choose_lr` picked and the validation score of each."""

    lr: float
    scores: dict[float, float]  # pooled validation accuracy after `rounds` rounds
    rounds: int

    def to_dict(self) -> dict[str, object]:
        return {"lr": self.lr, "grid": list(self.scores), "val_accuracy": list(self.scores.values()),
                "rounds": self.rounds, "scored_on": "pooled node validation splits"}


def choose_lr(
    run_config: dict, num_nodes: int, strategy: str, grid: tuple[float, ...] = SGD_LR_GRID,
    rounds: int = 10, local_epochs: int = 1, proximal_mu: float = 0.01,
) -> LrChoice:
    """SGD's learning rate from ``grid``: the one whose ``rounds``-round federated run
    scores best on the pooled validation split (ties: the first in ``grid``).

    The test set is never looked at; each short run starts from the same initial model
    as the full run (same seed).
    """
    if not grid or any(lr <= 0 for lr in grid):
        raise ValueError(f"the learning-rate grid {grid!r} must be non-empty and positive")
    scores = {}
    for lr in grid:
        curve = run_federated(run_config, num_nodes, strategy, rounds, local_epochs, proximal_mu,
                              optimizer="sgd", lr=lr, evaluate_on="val")
        scores[float(lr)] = curve.accuracy[-1]
    best = max(scores, key=scores.get)  # the first maximum: the smallest tied rate
    return LrChoice(lr=best, scores=scores, rounds=rounds)


def run_sgd(
    run_config: dict, num_nodes: int, strategy: str, num_rounds: int, local_epochs: int = 1,
    proximal_mu: float = 0.01, grid: tuple[float, ...] = SGD_LR_GRID, tune_rounds: int = 10,
) -> FederatedCurve:
    """FedAvg-SGD / FedProx-SGD: choose the rate on validation, then the full test curve."""
    t0 = time.perf_counter()
    choice = choose_lr(run_config, num_nodes, strategy, tuple(grid), tune_rounds, local_epochs,
                       proximal_mu)
    curve = run_federated(run_config, num_nodes, strategy, num_rounds, local_epochs, proximal_mu,
                          optimizer="sgd", lr=choice.lr)
    curve.tuning = choice.to_dict()
    curve.seconds = time.perf_counter() - t0
    return curve

