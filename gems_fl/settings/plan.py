"""The run plan: a run's settings with every ``auto`` resolved, once, when the server knows
its roster (how many nodes, how many features and classes). ``results.json`` records it
(``plan``), so a run says what it did, not only what it was asked.

What the plan resolves: the hidden widths (``hidden=auto``), the form of the output
layer's Gram reply (``gram-rank``) and whether class Gram matrices travel
(``class-grams``) for the logistic model's layer, the points the selection round may
choose among (``gram-point=auto``) with the values it scores, what the server keeps of the
replies (``server-grams``), the refinement penalty (``refine-l2``) and the device. The
MLP's output layer learns its width in its own round: there the plan gives the rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from gems_fl.geometry.choices import (
    CLASS_GRAMS_AUTO_MAX,
    DEFAULT_REFINE_L2,
    ClassGrams,
    class_gram_rank_for,
    class_grams_for,
    gram_rank_for,
)
from gems_fl.geometry.points import (
    AUTO,
    CENTERS,
    CLASS_GRAMS,
    COMPONENTS,
    LABELS,
    POINTS,
    point_named,
)
from gems_fl.learning.train import resolve_device
from gems_fl.settings.options import holds_sums, space_options

if TYPE_CHECKING:  # the package imports this module
    from gems_fl.settings import Settings

__all__ = ["RunPlan", "build_plan", "refine_l2_for"]


@dataclass(frozen=True)
class RunPlan:
    """What a run does, every ``auto`` resolved (see the module docstring)."""

    model: str
    hidden_widths: tuple[int, ...]
    space: str
    nodes: int
    layer_size: int | None  # the logistic model's layer: features + 1 (None: the MLP's)
    gram_rank: int | str  # 0: the whole matrix; r: a rank-r factor; the MLP: its rule
    class_grams: bool | str  # whether class Gram matrices travel; the MLP: its rule
    class_gram_rank: int | None  # their factor rank (0: whole)
    gram_point: str
    points: tuple[str, ...]  # what the selection round may choose among
    values: dict[str, tuple[float | None, ...]]  # what it scores of each
    server_holds: str  # "sums" or "every node's reply"
    refine_rounds: int
    refine_l2: float
    baselines: str
    profile: str
    device: str
    features: str = ""  # the feature map the identity round agreed on, in words
    #: the kernel model: the logistic family's points on the rows' own columns, which the
    #: selection round scores beside ``points`` (with the class statistics they need)
    column_points: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``results.json`` holds it."""
        out = asdict(self)
        out["hidden_widths"] = list(self.hidden_widths)
        out["points"] = list(self.points)
        out["column_points"] = list(self.column_points)
        out["values"] = {k: list(v) for k, v in self.values.items()}
        return out


def refine_l2_for(settings: Settings) -> float:
    """``refine-l2`` as a number: ``auto`` is the penalty chosen on validation for the
    logistic model, and none for the MLP's output layer (not chosen there)."""
    if settings.refine_l2 != "auto":
        return float(settings.refine_l2)
    return DEFAULT_REFINE_L2 if settings.model_kind.convex else 0.0


def build_plan(settings: Settings, num_nodes: int, num_features: int) -> RunPlan:
    """The plan of a run of ``settings`` on ``num_nodes`` nodes holding ``num_features``
    features (the identity round's agreement)."""
    gram = settings.space_kind.statistics
    options = space_options(settings)
    if options.class_grams == ClassGrams.AUTO and CLASS_GRAMS in point_named(settings.gram_point).needs:
        options = replace(options, class_grams="true")  # the point needs them at any size
    if settings.model_kind.convex:
        size = num_features + 1
        rank = gram_rank_for(options.gram_rank, size, settings.model_kind.gram_rank_share) \
            if gram else 0
        sent = gram and options.label_moments and class_grams_for(
            options.class_grams, size, options.gram_rank)
        if settings.model_kind.feature_map is not None and options.class_grams == ClassGrams.AUTO:
            sent = False  # a factor per class at D + 1 inputs: bytes the measured points skip
        class_rank = class_gram_rank_for(options.gram_rank, size) if sent else None
        if sent and settings.secure_aggregation:  # SecAgg+ sums them per class, whole:
            if class_rank and options.class_grams != "true":  # not where a factor would go
                sent, class_rank = False, None
            else:
                class_rank = 0
    else:
        size, class_rank = None, None
        rank = options.gram_rank if options.gram_rank != "auto" else \
            "auto: per merged width (the factor where it is smaller than the matrix)"
        sent = (ClassGrams.FALSE.value if options.class_grams == ClassGrams.FALSE or not options.label_moments else
                f"{options.class_grams}: whole up to a merged width of {CLASS_GRAMS_AUTO_MAX - 1}")
    sums = holds_sums(settings, num_nodes, size or 0)
    # what the nodes are asked to send; the mixture point also needs a node that splits a
    # class into components, which only its data says: `points` are the most it chooses among
    asked = set() if settings.dp_epsilon else {CENTERS}  # noised sums hold no W_k G_k
    if options.label_moments:
        asked.add(LABELS)
    if sent:
        asked.add(CLASS_GRAMS)
        if options.class_components > 1 and not class_rank and not sums:
            asked.add(COMPONENTS)
    if gram and settings.gram_point == AUTO:
        points = tuple(p.name for p in POINTS.values() if p.needs <= asked)
    else:
        points = (point_named(settings.gram_point).name,) if gram else ()
    chosen = settings.gram_point != AUTO
    values = {name: point_named(name).values(settings.pooled_ridges, chosen=chosen)
              for name in points}
    # the kernel model's rows beside: the logistic family's points on them, with the class
    # Gram matrices of those columns from every node's plain reply (not secure sums, not DP)
    column_asked = {LABELS} | ({CLASS_GRAMS} if not (settings.secure_aggregation
                                                    or settings.dp_epsilon) else set())
    column_points = tuple(
        p.name for p in POINTS.values()
        if p.regularisation is not None and p.needs <= column_asked
        and (not chosen or p.name == point_named(settings.gram_point).name)
    ) if (gram and options.label_moments and settings.model_kind.rows_beside) else ()
    return RunPlan(
        model=settings.model, hidden_widths=tuple(settings.hidden_widths)
        if settings.model_kind.layerwise else (), space=settings.space, nodes=int(num_nodes),
        layer_size=size, gram_rank=rank, class_grams=sent, class_gram_rank=class_rank,
        gram_point=settings.gram_point, points=points, values=values,
        server_holds="sums" if sums else "every node's reply",
        refine_rounds=settings.refine_rounds, refine_l2=refine_l2_for(settings),
        baselines=settings.baselines, profile=settings.profile,
        device=str(resolve_device(settings.device)), column_points=column_points)
