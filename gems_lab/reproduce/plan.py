"""Which trials each study of the reproduction needs.

A trial is one federated run: a GEMS run through the real ServerApp/ClientApp code
(:func:`gems_fl.serverapp.run.run_server` over :class:`gems_fl.protocol.inprocess.InProcessGrid`), or a
FedAvg/FedProx run with Flower's strategies. Studies share trials where they can: the
fine-tuning study (3) is the K=5 convex and MLP trials of studies 1 and 2 with the
fine-tuning curve switched on, and the model-size grid (4) reuses study 2's K=5 trial
for its default point.

Studies 1 and 2 run every output space of ``Options.spaces`` / ``nn_spaces`` (the paper's
ellipsoid and ball, and the logit-space ``gram``) on every setup of :meth:`Options.setups`
(K=2 with the appendix's division and with ``k2_split``, K=3, K=5); study 1 also sweeps
``gram-rank`` for convex K=5 (bytes up per node against accuracy). Study 6 runs FedAvg and
FedProx twice: with the Adam recipe, and with local SGD whose learning rate each trial
chooses on the pooled node validation splits, from ``logistic_sgd_lrs`` for the logistic
model and ``sgd_lrs`` for the MLP. Study 7 runs, on every
Dirichlet division, the Gram points of ``dirichlet_points``, the paper's spaces of
``dirichlet_spaces``, the refined model of both models and, last because they cost most,
the local-SGD FedAvg/FedProx of ``dirichlet_baselines``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from gems_fl.geometry.choices import kind_traits
from gems_fl.learning.model_kinds import LOGISTIC_KIND
from gems_fl.settings import Settings
from gems_fl.settings.operation import PAPER_PROFILE, PROFILES

STUDIES = {
    1: "convex table (and gram-rank: bytes against accuracy)",
    2: "NN table",
    3: "fine-tuning study",
    4: "model size",
    5: "intersection analysis",
    6: "FedAvg / FedProx vs GEMS",
    7: "Dirichlet divisions: Gram points, paper's space, refinement, FedAvg/FedProx-SGD",
}


@dataclass(frozen=True)
class Options:
    """What to reproduce and how big (``--quick`` picks the small preset)."""

    dataset: str = "fashion-mnist"
    data_dir: str = ""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    ks: tuple[int, ...] = (2, 3, 5)
    studies: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    convex_eps: float = 0.4
    tune_sizes: tuple[int, ...] = (100, 200, 300, 400, 500, 600, 700, 800, 900, 1000)
    size_grid: tuple[tuple[int, float], ...] = ((50, 0.05), (75, 0.1), (100, 0.2), (150, 0.05))
    intersection_eps: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 0.9)
    fed_rounds: int = 100  # study 6: FedAvg/FedProx rounds (issue: GEMS vs 100 rounds)
    fed_local_epochs: int = 1
    fedprox_mu: float = 0.01
    spaces: tuple[str, ...] = ("ellipsoid", "ball", "gram")  # study 1 (convex)
    nn_spaces: tuple[str, ...] = ("ellipsoid", "ball", "gram")  # study 2 (MLP output layer)
    k2_split: str = "0,1,2,3,4/5,6,7,8,9"  # a second K=2 division ("" for none)
    # study 1, convex K=5: r, "auto" (a rank by matrix size), 0 the full Gram (the default)
    gram_ranks: tuple[int | str, ...] = (5, 20, 50, 100, "auto", 0)
    sgd_lrs: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)  # study 6, local SGD's grid
    sgd_tune_rounds: int = 10  # rounds of each short run that scores an SGD rate
    dirichlet_alphas: tuple[float, ...] = (0.05, 0.1, 0.5)  # study 7's label priors
    dirichlet_ks: tuple[int, ...] = (5, 20)  # study 7's node counts
    dirichlet_points: tuple[str, ...] = ("closed-form", "pooled", "auto")  # study 7; last: default
    refine_rounds: int = 10  # study 7: the refined trials (both models); rows after 1, 5 and R
    dirichlet_spaces: tuple[str, ...] = ("ellipsoid",)  # study 7: the paper's spaces beside gram
    # study 7: FedAvg/FedProx with local SGD (study 6's recipe: a rate tuned on validation)
    dirichlet_baselines: tuple[str, ...] = ("fedavg", "fedprox")
    # studies 6 and 7, the logistic model's SGD grid: 51 of study 7's 60 logistic trials chose
    # sgd_lrs' top rate (0.3), so it goes two steps further
    # (results/reproduction/study7/lr_edge_grid_to_0.3.md); () keeps sgd_lrs. The MLP's
    # trials were not at the edge and keep sgd_lrs.
    logistic_sgd_lrs: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    overrides: tuple[tuple[str, object], ...] = ()  # run-config keys for every trial
    quick: bool = False
    # "product": the project's recipe (the committed tables); "paper": the paper's
    # recipe in every trial (profile='paper''s switches; each trial keeps its own space)
    profile: str = "product"

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile={self.profile!r}: give one of {', '.join(PROFILES)}")

    @classmethod
    def quick_preset(cls, **changes) -> Options:
        """Digits, 2 seeds, coarse grids, cheap settings: the CI smoke run."""
        base = dict(
            dataset="digits", seeds=(0, 1), tune_sizes=(50, 100, 200),
            size_grid=((20, 0.1), (40, 0.1)), intersection_eps=(0.3, 0.6, 0.9),
            fed_rounds=4, quick=True, nn_spaces=("ellipsoid", "gram"), gram_ranks=(5, "auto", 0),
            sgd_lrs=(0.03, 0.3), sgd_tune_rounds=2, dirichlet_alphas=(0.5,),
            dirichlet_ks=(3,), refine_rounds=2, logistic_sgd_lrs=(),
            overrides=(("num-directions", 100), ("local-max-epochs", 20)),
        )
        base.update(changes)
        return cls(**base)

    def setups(self) -> list[tuple[int, str]]:
        """(K, label-division) of the tables' rows: the appendix's division for every K
        in ``ks``, and ``k2_split`` as a second K=2 row."""
        out = []
        for k in self.ks:
            out.append((k, "paper"))
            if k == 2 and self.k2_split:
                out.append((2, self.k2_split))
        return out

    def sgd_grid(self, model: str) -> tuple[float, ...]:
        """The local-SGD learning rates a FedAvg/FedProx trial of ``model`` chooses from."""
        return (self.logistic_sgd_lrs or self.sgd_lrs) if model == LOGISTIC_KIND.name else self.sgd_lrs

    def trial_config(self, **run_config) -> dict:
        """A run config for one trial: these options' dataset and overrides plus keys."""
        # a study measures every outcome: a model good enough on few sites is a result
        # the paper's training recipe (Adam epochs) in every trial, as the tables were made
        cfg = {"dataset": self.dataset, "data-dir": self.data_dir, "baselines": "all",
               "min-good-enough": "0", "local-solve": "adam", **dict(self.overrides)}
        if self.profile == "paper":  # the paper's switches, spelled out: a trial's own
            # space (gram among them) must not read as "left at its default"
            cfg.update({k: v for k, v in PAPER_PROFILE.items() if k != "space"})
        cfg.update(run_config)
        return cfg


#: The settings whose values every stored trial's key holds, frozen with the stored trials.
#: A trial's key does not follow the product's settings list: a setting added since enters
#: a key only where the trial sets it away from its default, so adding a setting renames
#: no stored trial and this module need not learn it. (The price: changing such a setting's
#: default does not rerun stored trials; ``gems-fl reproduce --fresh`` does.)
TRIAL_KEY_SETTINGS = (
    "dataset", "data-dir", "site-files", "label-division", "allow-overlap", "num-features",
    "classes", "label-column", "standardize", "public-data", "vgg16-weights",
    "feature-cache-dir", "ham10000-per-class", "ham10000-cnn-epochs", "model", "hidden",
    "dropout", "local-lr", "batch-size", "local-max-epochs", "local-patience", "device",
    "public-samples", "tune-epochs", "tune-lr", "tune-stop", "tune-max-epochs", "tune-layers",
    "tune-fresh", "tune-curve", "space", "eps", "num-directions", "r-max", "delta",
    "ellipsoid-c", "ellipsoid-floor", "eps-neuron", "neuron-criterion", "neuron-delta",
    "gram-rank", "label-moments", "class-grams", "class-components", "clusters", "max-width",
    "gram-ridge", "gram-point", "pooled-ridge", "no-intersection", "server-grams",
    "refine-rounds", "refine-method", "refine-l2", "secure-aggregation", "secure-threshold",
    "dp-epsilon", "dp-delta", "dp-clip", "dp-seeded-noise", "seed", "min-replies",
    "required-nodes", "round-timeout", "evaluate-on-server", "output-dir")
#: Settings added after the first trials were stored and before the freeze above, with
#: the value every stored trial ran with (or computes the same with: min-rows applies to
#: own-data sites only, which no trial has, no trial declares feature-ranges, and the wait
#: before the identity round changes no result): at that value they stay out of a key.
LATER_SETTINGS = {"baselines": "all", "profile": "product", "min-good-enough": "0",
                  "site-wait": 60.0, "min-rows": 10, "feature-ranges": "",
                  "rf-map": "fourier", "rf-dim": 2048, "rf-bandwidth": "auto",
                  "val-fraction": 0.2, "id-columns": "auto", "kernel-landmarks": 4000,
                  "local-solve": "adam"}
#: Settings retired after trials were stored, with the one value every trial ran with (and
#: that the code still computes): they stay in the key, so the stored trials keep their names.
RETIRED_SETTINGS = {"gram-weighting": "samples"}
_DEFAULTS = Settings().to_config()


@dataclass
class Trial:
    """One federated run and where its outcome goes."""

    kind: str  # "gems" or "fedavg" / "fedprox"
    run_config: dict
    num_nodes: int
    node_configs: list[dict] | None = None
    studies: set[int] = field(default_factory=set)
    labels: dict = field(default_factory=dict)  # e.g. {"K": 5, "space": "ball"}
    federated: dict = field(default_factory=dict)  # FedAvg/FedProx: rounds, epochs, mu, (sgd)

    @property
    def key(self) -> str:
        """Stable identity: two trials with the same key are the same computation.

        The run config is normalised through :class:`~gems_fl.settings.Settings`, so a
        key spelled out at its default value names the same trial as one left out.
        """
        settings = Settings.from_run_config(self.run_config).to_config()
        for key, value in list(settings.items()):
            if key in LATER_SETTINGS:
                if value == LATER_SETTINGS[key]:
                    del settings[key]
            elif key not in TRIAL_KEY_SETTINGS and value == _DEFAULTS[key]:
                del settings[key]  # a setting newer than the stored trials, at its default
        settings.update(RETIRED_SETTINGS)
        return json.dumps([self.kind, settings, self.num_nodes, self.node_configs,
                           self.federated], sort_keys=True)

    @property
    def name(self) -> str:
        """Short file-safe name: a digest of :attr:`key`."""
        return hashlib.sha1(self.key.encode()).hexdigest()[:16]

    @property
    def seed(self) -> int:
        return int(self.run_config["seed"])


def build_plan(options: Options) -> list[Trial]:  # noqa: C901
    """Every trial the chosen studies need, deduplicated, ordered for the cache.

    Trials that differ only in the seed are adjacent: two workers then train different
    seeds at the same time, and the later configurations of a seed find its Global and
    local models already in the training cache. With the fine-tuning study on, every K=5
    GEMS trial with the ellipsoid (the space study 3 reports) also computes the
    fine-tuning curve, so study 3 needs no trial of its own.
    """
    trials: dict[str, Trial] = {}
    wanted = set(options.studies)
    curve = ",".join(str(n) for n in options.tune_sizes) if 3 in wanted else ""

    def add(study: int, kind: str, cfg: dict, num_nodes: int, labels: dict,
            node_configs: list[dict] | None = None, optimizer: str = "adam") -> None:
        settings = Settings.from_run_config(options.trial_config(**cfg))
        if (kind == "gems" and num_nodes == 5 and curve and settings.public_samples > 0
                and settings.space_kind.fisher_axes and settings.label_division == "paper"):
            cfg = {**cfg, "tune-curve": curve}
        for seed in options.seeds:
            federated = {} if kind == "gems" else {
                "rounds": options.fed_rounds, "local_epochs": options.fed_local_epochs,
                "proximal_mu": options.fedprox_mu if kind == "fedprox" else 0.0}
            if optimizer == "sgd":
                federated.update({"optimizer": "sgd", "lr_grid": list(options.sgd_grid(cfg["model"])),
                                  "tune_rounds": options.sgd_tune_rounds})
            trial = Trial(kind, options.trial_config(**cfg, seed=seed), num_nodes, node_configs,
                          {study}, {**labels, "seed": seed}, federated)
            if trial.key in trials:
                trials[trial.key].studies.add(study)
                trials[trial.key].labels.update(labels)
            else:
                trials[trial.key] = trial

    convex = {"model": "logistic", "eps": options.convex_eps}
    mlp = {"model": "mlp", "eps": options.convex_eps}

    def division(spec: str) -> dict:
        return {} if spec == "paper" else {"label-division": spec}

    for k, spec in options.setups() if 1 in wanted else ():
        for space in options.spaces:
            add(1, "gems", {**convex, **division(spec), "space": space}, k,
                {"K": k, "division": spec, "space": space, "model": "logistic"})
    for space in [s for s in options.spaces if kind_traits(s).statistics] if 1 in wanted else ():
        for rank in options.gram_ranks:
            # auto is the default: the K=5 gram trial itself
            cfg = {**convex, "space": space, **({"gram-rank": rank} if rank != "auto" else {})}
            add(1, "gems", cfg, 5, {"K": 5, "division": "paper", "space": space,
                                    "model": "logistic", "gram_rank": rank})
    for k, spec in options.setups() if 2 in wanted else ():
        for space in options.nn_spaces:
            add(2, "gems", {**mlp, **division(spec), "space": space}, k,
                {"K": k, "division": spec, "space": space, "model": "mlp"})
    if 3 in wanted:
        add(3, "gems", {**convex, "space": "ellipsoid"}, 5,
            {"K": 5, "division": "paper", "space": "ellipsoid", "model": "logistic"})
        add(3, "gems", {**mlp, "space": "ellipsoid"}, 5,
            {"K": 5, "division": "paper", "space": "ellipsoid", "model": "mlp"})
    if 4 in wanted:
        for clusters, eps_neuron in options.size_grid:
            add(4, "gems", {**mlp, "space": "ellipsoid", "clusters": clusters,
                            "eps-neuron": eps_neuron}, 5,
                {"K": 5, "model": "mlp", "clusters": clusters, "eps_neuron": eps_neuron})
    if 5 in wanted:
        for eps1 in options.intersection_eps:
            for eps2 in options.intersection_eps:
                add(5, "gems", {"model": "logistic", "space": "ball", "public-samples": 0}, 2,
                    {"K": 2, "eps1": eps1, "eps2": eps2},
                    node_configs=[{"partition-id": k, "num-partitions": 2, "eps": e}
                                  for k, e in enumerate((eps1, eps2))])
    if 6 in wanted:
        for model, base in (("logistic", convex), ("mlp", mlp)):
            for optimizer in ("adam", "sgd"):
                for strategy in ("fedavg", "fedprox"):
                    add(6, strategy, {"model": model}, 5,
                        {"K": 5, "model": model, "strategy": strategy, "optimizer": optimizer},
                        optimizer=optimizer)
            for space in ("ellipsoid", "gram"):
                add(6, "gems", {**base, "space": space}, 5,
                    {"K": 5, "division": "paper", "model": model, "space": space})
    if 7 in wanted:
        for alpha in options.dirichlet_alphas:
            spec = f"dirichlet:{alpha:g}"
            for k in options.dirichlet_ks:
                where = {"K": k, "division": spec}
                for model, base in (("logistic", convex), ("mlp", mlp)):
                    for point in options.dirichlet_points:
                        add(7, "gems", {**base, "label-division": spec, "space": "gram",
                                        "gram-point": point}, k,
                            {**where, "model": model, "point": point})
                    if options.refine_rounds and model == LOGISTIC_KIND.name:
                        add(7, "gems", {**base, "label-division": spec, "space": "gram",
                                        "refine-rounds": options.refine_rounds}, k,
                            {**where, "model": model, "point": "refined"})
        # Added after the first full run: appended, so that run's trials keep their order.
        for alpha in options.dirichlet_alphas:
            spec = f"dirichlet:{alpha:g}"
            for k in options.dirichlet_ks:
                where = {"K": k, "division": spec}
                if options.refine_rounds:
                    add(7, "gems", {**mlp, "label-division": spec, "space": "gram",
                                    "refine-rounds": options.refine_rounds}, k,
                        {**where, "model": "mlp", "point": "refined"})
                for model, base in (("logistic", convex), ("mlp", mlp)):
                    for space in options.dirichlet_spaces:
                        add(7, "gems", {**base, "label-division": spec, "space": space}, k,
                            {**where, "model": model, "point": space})
        for model in ("logistic", "mlp"):
            for alpha in options.dirichlet_alphas:
                spec = f"dirichlet:{alpha:g}"
                for k in options.dirichlet_ks:
                    for strategy in options.dirichlet_baselines:
                        add(7, strategy, {"model": model, "label-division": spec}, k,
                            {"K": k, "division": spec, "model": model, "strategy": strategy,
                             "optimizer": "sgd"}, optimizer="sgd")
    return list(trials.values())
