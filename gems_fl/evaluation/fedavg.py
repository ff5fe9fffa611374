"""FedAvg and FedProx baselines with Flower's own strategies, on GEMS's partitions.

The server side is :class:`flwr.serverapp.strategy.FedAvg` / ``FedProx`` unchanged; the
node side is :data:`fedavg_client_app`, which trains the received model for
``local-epochs`` epochs on exactly the data a GEMS node with the same node config trains
on (``gems_fl.data.nodes.load_node_data``: partition or own data file, and its seed), with the
same Adam recipe (a fresh optimiser each round), adding
FedProx's proximal term when the strategy sends ``proximal-mu``. Accuracy is measured on
the server's test set after every round, next to the bytes of the records exchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, FedProx
from torch import nn

from gems_fl.data import FeatureOptions, load_dataset
from gems_fl.protocol.inprocess import InProcessGrid
from gems_fl.learning.models import MLP, build_model
from gems_fl.data.nodes import cast_node_arrays, load_node_data
from gems_fl.settings import Settings
from gems_fl.learning.train import accuracy, fine_tune

STRATEGIES = ("fedavg", "fedprox")

fedavg_client_app = ClientApp()


def make_model(settings: Settings, num_features: int, num_classes: int) -> nn.Module:
    """The model GEMS uses for ``settings.model`` (logistic regression or the MLP)."""
    if settings.model == "mlp":
        return MLP(num_features, settings.hidden_widths, num_classes, settings.dropout)
    return build_model(settings.model, num_features, num_classes)


@fedavg_client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's partition; reply with it and its size."""
    settings = Settings.from_run_config(context.run_config)
    data = cast_node_arrays(load_node_data(settings, context.node_config))
    config = msg.content["config"]
    model = make_model(settings, data.num_features, data.num_classes)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    round_index = int(config["server-round"])
    fine_tune(model, data.x_train, data.y_train, epochs=int(config["local-epochs"]),
              lr=settings.local_lr, batch_size=settings.batch_size,
              seed=data.seed + 7919 * round_index,
              proximal_mu=float(config.get("proximal-mu", 0.0)))
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

    @property
    def bytes_total(self) -> list[int]:
        return [d + u for d, u in zip(self.bytes_down, self.bytes_up)]

    def to_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "rounds": self.rounds, "accuracy": self.accuracy,
                "bytes_down": self.bytes_down, "bytes_up": self.bytes_up,
                "bytes_total": self.bytes_total, "seconds": self.seconds}


def run_federated(
    run_config: dict, num_nodes: int, strategy: str, num_rounds: int,
    local_epochs: int = 1, proximal_mu: float = 0.01,
) -> FederatedCurve:
    """``num_rounds`` of FedAvg or FedProx over ``num_nodes`` in-process nodes."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    if num_rounds < 1 or local_epochs < 1:
        raise ValueError("num_rounds and local_epochs must be >= 1")
    t0 = time.perf_counter()
    settings = Settings.from_run_config(run_config)
    splits = load_dataset(settings.dataset, seed=settings.seed, data_dir=settings.data_dir or None,
                          features=FeatureOptions.from_settings(settings))
    torch.manual_seed(settings.seed)
    initial = make_model(settings, splits.num_features, splits.num_classes)
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=num_nodes,
                  min_available_nodes=num_nodes)
    chosen = (FedProx(proximal_mu=proximal_mu, **common) if strategy == "fedprox"
              else FedAvg(**common))
    grid = InProcessGrid(fedavg_client_app, num_nodes, run_config)
    probe = make_model(settings, splits.num_features, splits.num_classes)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        probe.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy(probe, splits.test_x, splits.test_y)})

    result = chosen.start(
        grid=grid, initial_arrays=ArrayRecord(initial.state_dict()), num_rounds=num_rounds,
        train_config=ConfigRecord({"local-epochs": local_epochs}), evaluate_fn=evaluate,
    )
    curve = FederatedCurve(strategy=strategy)
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

