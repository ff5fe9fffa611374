"""The models, one registered object each, without torch: the settings check them before
anything heavy loads.

A :class:`ModelKind` says everything the rest of the package asks of a model: whether it is
a convex model (a softmax-linear layer on the node's rows or on a fixed map of them: the
spaces round, then the selection round) or the layer-wise MLP, which map a node applies to
its rows before that layer, which settings it reads, and how a run's title names it. Code
elsewhere asks the kind (``model_kind(settings.model).convex``), never compares a model's
name: the next model is one object here and its tests (a house-rule test checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gems_fl.data.feature_map import MapRound, MapRule
from gems_fl.data.kernel_features import KernelFeatures, KernelRule, LandmarkRound
from gems_fl.data.random_features import RandomFeatures, RandomFeaturesRule

__all__ = ["KERNEL_KIND", "LOGISTIC_KIND", "MLP_KIND", "MODELS", "MODEL_KINDS",
           "RANDOM_FEATURES_KIND", "ModelKind", "feature_map_classes", "model_kind",
           "register_model", "unregister_model"]


@dataclass(frozen=True)
class ModelKind:
    """One model a run can train.

    Attributes
    ----------
    name : str
        The ``model`` setting's value.
    convex : bool
        A softmax-linear layer (on the rows, or on ``feature_map`` of them): one round of
        Gram spaces, the points, refinement, secure sums and DP apply. False: the MLP's
        layer-wise protocol (one round per hidden layer, then the output layer).
    feature_map : type or None
        The class of the fixed map a node applies to its (scaled) rows before the convex
        layer (a :class:`~gems_fl.data.feature_map.FeatureMap`: it reads the map back from
        a message's config and from a saved model), agreed in the identity round and saved
        with the model; None: the rows themselves.
    settings : tuple of str
        The settings only this model reads.
    width : callable or None
        ``width(settings, inputs)``: the convex layer's input width for a run with
        ``inputs`` features (None: the inputs themselves).
    gram_rank_share : int
        ``gram-rank=auto``: the factor's rank is the Gram matrix's size over this. The
        kernel features' spectrum is flatter than the rows' or random features': 5
        (results/benchmarks/kernel.json).
    exact_solve : bool
        ``local-solve=auto`` solves a site's problem exactly (:mod:`gems_fl.learning.exact`):
        where it is measured faster than Adam's epochs at the same h_G (the logistic
        model on Fashion-MNIST: 16.4 s against 33.4 s for five sites' fits and spaces,
        results/benchmarks/exact_solve.json). Not on the kernel model's features: 460
        iterations, 32 s, on a 2,470-row site, where Adam's epochs stop after 1.6 s.
    rows_beside : bool
        The layer's leading inputs are the rows themselves (the kernel model): the model
        family contains the logistic model, whose candidates (with the class statistics
        of those columns) the selection round scores too.
    titled : callable or None
        ``titled(cfg, meta, results)``: how a run's results table names the model (None:
        its name).
    map_rule : callable or None
        ``map_rule(settings, bandwidth)``: how the identity round builds the model's map,
        a :class:`~gems_fl.data.feature_map.MapRule` (``bandwidth``: ``rf-bandwidth``
        parsed, None for ``auto``).
    map_round : MapRound or None
        The model's own round after the identity round, where its map is built from
        summaries of the nodes' rows (the kernel model's landmarks; its rule's
        ``round_asks`` says how many): what a node sends and how the server checks it.
    map_from_rows : bool
        The map is built from summaries of the nodes' rows (the kernel model's landmarks):
        under ``dp-epsilon`` it is built from the server's own public rows instead, and a
        run without them is refused before it starts.
    """

    name: str
    convex: bool
    feature_map: type | None = None
    settings: tuple[str, ...] = ()
    width: Callable[[Any, int], int] | None = None
    gram_rank_share: int = 16
    exact_solve: bool = False
    rows_beside: bool = False
    titled: Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], str] | None = None
    map_rule: Callable[[Any, float | None], MapRule] | None = None
    map_round: MapRound | None = None
    map_from_rows: bool = False

    def layer_width(self, settings: Any, inputs: int) -> int:
        """The width of the convex layer's input (before the bias) for ``inputs`` features:
        an upper bound for the kernel model, whose nodes may send fewer landmarks; 0 where
        the settings do not say it (a node's, for the kernel model)."""
        return int(inputs) if self.width is None else int(self.width(settings, int(inputs)))

    @property
    def layerwise(self) -> bool:
        """The MLP's protocol: hidden layers merged one round each."""
        return not self.convex

    def title(self, cfg: Mapping[str, Any], meta: Mapping[str, Any],
              results: Mapping[str, Any]) -> str:
        """How a run's results table names the model (``cfg``: the run's settings,
        ``meta``: its dataset record)."""
        return self.name if self.titled is None else self.titled(cfg, meta, results)


def _random_features_title(cfg: Mapping[str, Any], meta: Mapping[str, Any],
                           results: Mapping[str, Any]) -> str:
    rf = meta.get("random_features") or {}
    return (f"logistic on {rf.get('rf-map', cfg.get('rf-map'))} random features, "
            f"D={rf.get('rf-dim', cfg.get('rf-dim'))}")


def _kernel_title(cfg: Mapping[str, Any], meta: Mapping[str, Any],
                  results: Mapping[str, Any]) -> str:
    fmap = meta.get("feature_map") or {}
    return (f"logistic on the rows and {fmap.get('landmarks', cfg.get('kernel-landmarks'))} "
            f"Nystrom features, D={fmap.get('dim', '?')}")


def _mlp_title(cfg: Mapping[str, Any], meta: Mapping[str, Any],
               results: Mapping[str, Any]) -> str:
    return (f"MLP hidden {cfg['hidden']} -> aggregated {results.get('hidden_widths')}, "
            f"eps_j={cfg['eps-neuron']}, m_eps={cfg['clusters']}")


LOGISTIC_KIND = ModelKind("logistic", convex=True, exact_solve=True)
RANDOM_FEATURES_KIND = ModelKind("random-features", convex=True, feature_map=RandomFeatures,
                                 settings=("rf-map", "rf-dim", "rf-bandwidth"),
                                 width=lambda s, inputs: int(s.rf_dim or 0),
                                 titled=_random_features_title,
                                 map_rule=lambda s, bandwidth: RandomFeaturesRule(
                                     s.rf_map, int(s.rf_dim), bandwidth, int(s.seed)))
KERNEL_KIND = ModelKind("kernel", convex=True, feature_map=KernelFeatures,
                        settings=("kernel-landmarks", "rf-bandwidth"),
                        # 0 (not known) where the count is not given: a node's settings
                        # do not carry it (the map in its messages says the width)
                        width=lambda s, inputs: int(s.kernel_landmarks) + inputs
                        if s.kernel_landmarks else 0, gram_rank_share=5, rows_beside=True,
                        titled=_kernel_title, map_round=LandmarkRound(), map_from_rows=True,
                        map_rule=lambda s, bandwidth: KernelRule(
                            int(s.kernel_landmarks), bandwidth, int(s.seed)))
MLP_KIND = ModelKind("mlp", convex=False, settings=("hidden", "dropout", "eps-neuron",
                                               "neuron-criterion", "neuron-delta", "clusters"),
                     titled=_mlp_title)

#: every model a run can name, built in or registered (:func:`register_model`)
MODEL_KINDS: dict[str, ModelKind] = {k.name: k for k in (LOGISTIC_KIND, RANDOM_FEATURES_KIND,
                                                               KERNEL_KIND, MLP_KIND)}
#: the built-in models' names
MODELS = tuple(MODEL_KINDS)


def register_model(kind: ModelKind) -> ModelKind:
    """Make ``kind`` a model a run can name (``model='<its name>'``) in this process: the
    settings accept it, the nodes and the server ask it what they ask every model, and a
    saved model that carries its map loads. A name already registered is refused (say
    :func:`unregister_model` first to replace one)."""
    if not isinstance(kind, ModelKind):
        raise TypeError(f"register a ModelKind, not {type(kind).__name__}")
    if kind.name in MODEL_KINDS:
        raise ValueError(f"a model named {kind.name!r} is registered already")
    if not kind.convex and kind.feature_map is not None:
        raise ValueError(f"model {kind.name!r}: a feature map needs a convex model")
    MODEL_KINDS[kind.name] = kind
    return kind


def unregister_model(name: str) -> None:
    """Forget a model :func:`register_model` added (a built-in model stays)."""
    if name in MODELS:
        raise ValueError(f"{name!r} is a built-in model; it cannot be removed")
    MODEL_KINDS.pop(name, None)


def feature_map_classes() -> tuple[type, ...]:
    """The map classes of the registered models, once each, in registration order."""
    return tuple(dict.fromkeys(k.feature_map for k in MODEL_KINDS.values()
                               if k.feature_map is not None))


def model_kind(name: str) -> ModelKind:
    """The registered model ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return MODEL_KINDS[str(name)]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(MODEL_KINDS)}") from None
