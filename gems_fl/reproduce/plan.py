"""Which trials each study of the reproduction needs.

A trial is one federated run: a GEMS run through the real ServerApp/ClientApp code
(:func:`gems_fl.running.server.run_server` over :class:`gems_fl.protocol.inprocess.InProcessGrid`), or a
FedAvg/FedProx run with Flower's strategies. Studies share trials where they can: the
fine-tuning study (3) is the K=5 convex and MLP trials of studies 1 and 2 with the
fine-tuning curve switched on, and the model-size grid (4) reuses study 2's K=5 trial
for its default point.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from gems_fl.settings import Settings

STUDIES = {
    1: "convex table",
    2: "NN table",
    3: "fine-tuning study",
    4: "model size",
    5: "intersection analysis",
    6: "FedAvg / FedProx vs GEMS",
}


@dataclass(frozen=True)
class Options:
    """What to reproduce and how big (``--quick`` picks the small preset)."""

    dataset: str = "fashion-mnist"
    data_dir: str = ""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    ks: tuple[int, ...] = (2, 3, 5)
    studies: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    convex_eps: float = 0.4
    tune_sizes: tuple[int, ...] = (100, 200, 300, 400, 500, 600, 700, 800, 900, 1000)
    size_grid: tuple[tuple[int, float], ...] = ((50, 0.05), (75, 0.1), (100, 0.2), (150, 0.05))
    intersection_eps: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 0.9)
    fed_rounds: int = 30
    fed_local_epochs: int = 1
    fedprox_mu: float = 0.01
    overrides: tuple[tuple[str, object], ...] = ()  # run-config keys for every trial
    quick: bool = False

    @classmethod
    def quick_preset(cls, **changes) -> "Options":
        """Digits, 2 seeds, coarse grids, cheap settings: the CI smoke run."""
        base = dict(
            dataset="digits", seeds=(0, 1), tune_sizes=(50, 100, 200),
            size_grid=((20, 0.1), (40, 0.1)), intersection_eps=(0.3, 0.6, 0.9),
            fed_rounds=4, quick=True,
            overrides=(("num-directions", 100), ("local-max-epochs", 20)),
        )
        base.update(changes)
        return cls(**base)

    def trial_config(self, **run_config) -> dict:
        """A run config for one trial: these options' dataset and overrides plus keys."""
        cfg = {"dataset": self.dataset, "data-dir": self.data_dir, **dict(self.overrides)}
        cfg.update(run_config)
        return cfg


@dataclass
class Trial:
    """One federated run and where its outcome goes."""

    kind: str  # "gems" or "fedavg" / "fedprox"
    run_config: dict
    num_nodes: int
    node_configs: list[dict] | None = None
    studies: set[int] = field(default_factory=set)
    labels: dict = field(default_factory=dict)  # e.g. {"K": 5, "space": "ball"}
    federated: dict = field(default_factory=dict)  # FedAvg/FedProx: rounds, epochs, mu

    @property
    def key(self) -> str:
        """Stable identity: two trials with the same key are the same computation.

        The run config is normalised through :class:`~gems_fl.settings.Settings`, so a
        key spelled out at its default value names the same trial as one left out.
        """
        settings = Settings.from_run_config(self.run_config).to_config()
        return json.dumps([self.kind, settings, self.num_nodes, self.node_configs,
                           self.federated], sort_keys=True)

    @property
    def name(self) -> str:
        """Short file-safe name: a digest of :attr:`key`."""
        return hashlib.sha1(self.key.encode()).hexdigest()[:16]

    @property
    def seed(self) -> int:
        return int(self.run_config["seed"])


def build_plan(options: Options) -> list[Trial]:
    """Every trial the chosen studies need, deduplicated, ordered for the cache.

    Trials that differ only in the seed are adjacent: two workers then train different
    seeds at the same time, and the later configurations of a seed find its Global and
    local models already in the training cache. With the fine-tuning study on, every K=5
    GEMS trial also computes the fine-tuning curve, so study 3 needs no trial of its own.
    """
    trials: dict[str, Trial] = {}
    wanted = set(options.studies)
    curve = ",".join(str(n) for n in options.tune_sizes) if 3 in wanted else ""

    def add(study: int, kind: str, cfg: dict, num_nodes: int, labels: dict,
            node_configs: list[dict] | None = None) -> None:
        if kind == "gems" and num_nodes == 5 and curve and cfg.get("public-samples", 1) > 0:
            cfg = {**cfg, "tune-curve": curve}
        for seed in options.seeds:
            federated = {} if kind == "gems" else {
                "rounds": options.fed_rounds, "local_epochs": options.fed_local_epochs,
                "proximal_mu": options.fedprox_mu if kind == "fedprox" else 0.0}
            trial = Trial(kind, options.trial_config(**cfg, seed=seed), num_nodes, node_configs,
                          {study}, {**labels, "seed": seed}, federated)
            if trial.key in trials:
                trials[trial.key].studies.add(study)
                trials[trial.key].labels.update(labels)
            else:
                trials[trial.key] = trial

    convex = {"model": "logistic", "eps": options.convex_eps}
    mlp = {"model": "mlp", "eps": options.convex_eps}
    for k in options.ks if 1 in wanted else ():
        for space in ("ellipsoid", "ball"):
            add(1, "gems", {**convex, "space": space}, k, {"K": k, "space": space, "model": "logistic"})
    for k in options.ks if 2 in wanted else ():
        add(2, "gems", mlp, k, {"K": k, "model": "mlp"})
    if 3 in wanted:
        add(3, "gems", {**convex, "space": "ellipsoid"}, 5, {"K": 5, "space": "ellipsoid", "model": "logistic"})
        add(3, "gems", mlp, 5, {"K": 5, "model": "mlp"})
    if 4 in wanted:
        for clusters, eps_neuron in options.size_grid:
            add(4, "gems", {**mlp, "clusters": clusters, "eps-neuron": eps_neuron}, 5,
                {"K": 5, "model": "mlp", "clusters": clusters, "eps_neuron": eps_neuron})
    if 5 in wanted:
        for eps1 in options.intersection_eps:
            for eps2 in options.intersection_eps:
                add(5, "gems", {"model": "logistic", "space": "ball", "public-samples": 0}, 2,
                    {"K": 2, "eps1": eps1, "eps2": eps2},
                    node_configs=[{"partition-id": k, "num-partitions": 2, "eps": e}
                                  for k, e in enumerate((eps1, eps2))])
    if 6 in wanted:
        for model, gems_cfg in (("logistic", {**convex, "space": "ellipsoid"}), ("mlp", mlp)):
            for strategy in ("fedavg", "fedprox"):
                cfg = {"model": model}
                add(6, strategy, cfg, 5, {"K": 5, "model": model, "strategy": strategy})
            add(6, "gems", gems_cfg, 5, {"K": 5, "model": model})
    return list(trials.values())
