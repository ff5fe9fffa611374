"""The rules between run settings (one setting's meaning depends on another): checked
by :class:`gems_fl.settings.Settings` after each setting passed its own check."""

from __future__ import annotations

import math
from typing import Protocol

from gems_fl.data.agreement import NODE_FILES, Scaling
from gems_fl.geometry.choices import SPACE_R_MAX, ClassGrams, KindTraits
from gems_fl.geometry.points import CENTERS, CLASS_GRAMS, LABELS, point_named, solvable_from_sums
from gems_fl.learning.model_kinds import ModelKind
from gems_fl.settings.checks import SettingsError
from gems_fl.settings.operation import Baselines
from gems_fl.settings.values import parse_gram_rank


class Settings(Protocol):
    """What the rules read of a :class:`gems_fl.settings.Settings` (a structural type: that
    package imports this module, so this one cannot import it)."""

    dataset: str
    num_features: int
    classes: str
    standardize: str
    feature_ranges: str
    public_data: str
    public_samples: int
    model: str
    rf_bandwidth: str
    space: str
    r_max: float
    gram_rank: int | str
    gram_point: str
    class_grams: bool | str
    label_moments: bool
    server_grams: str
    secure_aggregation: bool
    refine_rounds: int
    dp_epsilon: float
    delta: float
    baselines: str
    evaluate_on_server: bool
    tune_curve: str

    @property
    def model_kind(self) -> ModelKind: ...

    @property
    def space_kind(self) -> KindTraits: ...


def check_rules(settings: Settings, node_only: bool) -> None:
    """Raise :class:`SettingsError` naming the settings that contradict each other
    (``node_only``: the settings a node holds, the server-side ones unset)."""
    bound = settings.r_max or SPACE_R_MAX[settings.space]
    if settings.delta >= bound:
        own = "" if settings.r_max else f" (space='{settings.space}''s own bound)"
        raise SettingsError(
            f"delta={settings.delta} must be smaller than r-max={bound}{own}: delta is "
            "the width at which the radius bisection over [0, r-max] stops"
        )
    _dataset_shape(settings)
    if not node_only:
        _node_files(settings)
        _feature_ranges(settings)
        _random_features(settings)
        if settings.tune_curve.strip() and settings.baselines != Baselines.ALL:
            raise SettingsError(
                f"tune-curve={settings.tune_curve!r} is the paper's fine-tuning study, which "
                f"tunes on the server: set baselines='all' (now {settings.baselines!r})")
        needs = point_named(settings.gram_point).needs
        if settings.space_kind.statistics and LABELS in needs and not settings.label_moments:
            raise SettingsError(
                f"gram-point='{settings.gram_point}' fits the labels of all nodes from their "
                "label moments: set label-moments=true, or gram-point='closed-form'")
        if settings.space_kind.statistics and CLASS_GRAMS in needs and settings.class_grams == ClassGrams.FALSE:
            raise SettingsError(
                f"gram-point='{settings.gram_point}' fits virtual rows of each class's "
                "Gaussians, from the nodes' class Gram matrices: set class-grams to 'auto' or "
                "'true'")
        _server_grams(settings)
        if settings.refine_rounds and not settings.space_kind.statistics:
            raise SettingsError(
                f"refine-rounds={settings.refine_rounds} steps with the nodes' Gram matrices: "
                "set space='gram', or refine-rounds=0")


def _server_grams(settings: Settings) -> None:
    """``server-grams=sums`` and ``secure-aggregation`` keep no node's matrix: only the
    points solved from sums."""
    if settings.server_grams == "sums" and (wrong := _not_from_sums(settings)):
        raise SettingsError("server-grams='sums' keeps only the sums of the nodes' Gram "
                            "statistics, which does not fit " + "; ".join(wrong)
                            + ". Use server-grams='nodes' or 'auto'")
    _differential_privacy(settings)
    if not settings.secure_aggregation:
        return
    wrong = _not_from_sums(settings)
    if not settings.label_moments:
        wrong.append("label-moments=false (the secure sums include the label moments)")
    if settings.server_grams == "nodes":
        wrong.append("server-grams='nodes' (the server holds only sums)")
    if settings.refine_rounds:
        wrong.append(f"refine-rounds={settings.refine_rounds} (each step's gradients would "
                     "reach the server node by node)")
    if wrong:
        raise SettingsError("secure-aggregation=true sends only sums through SecAgg+, which "
                            "does not fit " + "; ".join(wrong))


def _differential_privacy(settings: Settings) -> None:
    """``dp-epsilon``: nodes send only noised sums, so only the points solved from sums of
    the Gram statistics and label moments, and nothing that needs a node's model."""
    if not settings.dp_epsilon:
        return
    if not math.isfinite(settings.dp_epsilon):
        raise SettingsError(f"dp-epsilon={settings.dp_epsilon!r} must be finite (0: off)")
    wrong = _not_from_sums(settings)
    if CENTERS in point_named(settings.gram_point).needs:
        wrong.append(f"gram-point='{settings.gram_point}' (needs each node's W_k G_k, which "
                     "is not noised; use auto, pooled or lda)")
    if settings.class_grams == ClassGrams.TRUE:
        wrong.append("class-grams=true (the noised sums hold no class Gram matrices)")
    if not settings.label_moments:
        wrong.append("label-moments=false (the noised sums are the Gram matrix and the "
                     "label moments)")
    if settings.server_grams == "nodes":
        wrong.append("server-grams='nodes' (the server receives only noised sums)")
    if settings.refine_rounds:
        wrong.append(f"refine-rounds={settings.refine_rounds} (each step's gradients would "
                     "leave the nodes without noise)")
    if settings.standardize == Scaling.FEDERATED:
        wrong.append("standardize='federated' (each node's per-feature sums would leave it "
                     "without noise in the identity round; declare the features' ranges with "
                     "feature-ranges, or use 'off' or 'node')")
    if wrong:
        raise SettingsError(f"dp-epsilon={settings.dp_epsilon:g}: nodes send only noised "
                            "sums, which does not fit " + "; ".join(wrong))


def _random_features(settings: Settings) -> None:
    """Under ``dp-epsilon`` the identity round sends no feature sums: the random-feature
    map's bandwidth must be given; a map built from the nodes' rows (``map_from_rows``:
    landmarks) comes from the server's own public rows (class centres the nodes would send
    have no privacy account), so the server must hold some."""
    kind = settings.model_kind
    if kind.map_from_rows and settings.dp_epsilon and not (
            settings.public_data.strip()
            or (settings.dataset != NODE_FILES and settings.public_samples > 0)):
        raise SettingsError(
            f"model={kind.name!r} with dp-epsilon={settings.dp_epsilon:g} takes its landmarks "
            "from the server's own public rows (the class centres nodes send otherwise, each "
            "the mean of a few of their rows, have no privacy account), and the server "
            "holds none: set public-samples above 0 (a named dataset) or public-data (a file of "
            "the sites' features)")
    if kind.feature_map is not None and not kind.map_from_rows and settings.dp_epsilon \
            and str(settings.rf_bandwidth).strip().lower() == "auto":
        raise SettingsError(
            f"model={kind.name!r} with dp-epsilon={settings.dp_epsilon:g}: rf-bandwidth "
            "'auto' derives the map's bandwidth from the nodes' per-feature sums, which would "
            "leave them unnoised; give rf-bandwidth as a number (in the features' units after "
            "standardize; with feature-ranges mapping d features to [-1, 1], spread evenly "
            "there, auto would give 0.6 * sqrt(2 d / 3), about 0.5 * sqrt(d))")


def _not_from_sums(settings: Settings) -> list[str]:
    """The settings that need more than the sums of the Gram statistics, each with why."""
    wrong = []
    if not settings.space_kind.statistics or not settings.model_kind.convex:
        wrong.append(f"space='{settings.space}', model='{settings.model}' (needs the logistic "
                     "model's Gram spaces: the MLP's layer merge needs every node's neurons)")
    if not solvable_from_sums(settings.gram_point):
        wrong.append(f"gram-point='{settings.gram_point}' (needs every node's matrices; use "
                     "a point solvable from sums, e.g. auto or pooled)")
    return wrong


def _dataset_shape(settings: Settings) -> None:
    """``num-features`` and ``classes`` pin ``node-files`` runs; a named dataset has its own."""
    from gems_fl.data.site_files import parse_classes

    kind = settings.model_kind
    if settings.dataset == NODE_FILES:
        if settings.num_features or kind.width is not None and kind.width(settings, 0):
            _gram_rank(settings, kind.layer_width(settings, settings.num_features))
        return
    from gems_fl.data.datasets import DATASET_SHAPES

    features, count = DATASET_SHAPES[settings.dataset]
    _gram_rank(settings, kind.layer_width(settings, features))
    classes = parse_classes(settings.classes)
    if settings.num_features not in (0, features):
        raise SettingsError(f"num-features={settings.num_features} but dataset='{settings.dataset}' "
                            f"has {features}; num-features pins dataset='node-files' runs")
    if classes is not None and (classes if isinstance(classes, int) else len(classes)) != count:
        raise SettingsError(f"classes={settings.classes!r} but dataset='{settings.dataset}' has "
                            f"{count} classes; classes pins dataset='node-files' runs")


def _gram_rank(settings: Settings, features: int) -> None:
    """A rank-r factor of the logistic model's (d+1) x (d+1) Gram matrix is smaller
    than the matrix only for r < d + 1 (``features`` 0: not known before the run)."""
    rank = parse_gram_rank(settings.gram_rank)
    if not settings.space_kind.statistics or not settings.model_kind.convex or not features \
            or rank == "auto" or rank < features + 1:
        return
    raise SettingsError(
        f"gram-rank={rank} but the Gram matrix is {features + 1} x {features + 1} "
        f"({features} features and the bias): a rank-{rank} factor would send "
        f"more than the matrix itself; use gram-rank=0 (the full matrix), auto, or a rank "
        f"below {features + 1}")


def _feature_ranges(settings: Settings) -> None:
    """``standardize='ranges'`` and ``feature-ranges`` come together."""
    given = bool(settings.feature_ranges.strip())
    if settings.standardize == Scaling.RANGES and not given:
        raise SettingsError(
            "standardize='ranges' scales with declared ranges: give feature-ranges (a CSV "
            "file on the server, header 'feature,min,max', one row per feature)")
    if given and settings.standardize != Scaling.RANGES:
        raise SettingsError(
            f"feature-ranges={settings.feature_ranges!r} is read only with standardize "
            f"'ranges' or 'auto', not {settings.standardize!r}: leave one of them out")


def _node_files(settings: Settings) -> None:
    """What the server needs for ``dataset='node-files'`` (it holds no node's data)."""
    if settings.dataset != NODE_FILES:
        return
    if settings.evaluate_on_server and not settings.public_data.strip():
        raise SettingsError(
            "dataset='node-files' keeps the data on the nodes, so the server has nothing "
            "to evaluate on: set evaluate-on-server=false (the nodes evaluate every "
            "model on their own data), or give public-data with a test split")
    if settings.evaluate_on_server and settings.model_kind.layerwise:
        raise SettingsError(
            "dataset='node-files' with model='mlp': set evaluate-on-server=false (the "
            "server cannot rebuild the nodes' local MLPs without their data)")
