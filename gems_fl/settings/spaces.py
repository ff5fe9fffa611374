"""Settings of the good-enough spaces a node builds: the space kind, its accuracy
target and radius search, and the statistics a Gram reply carries.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass

from gems_fl.geometry.choices import CLASS_GRAMS, ELLIPSOID_FLOORS, SPACE_KINDS
from gems_fl.settings.checks import at_least, in_range, one_of, parses, positive, setting
from gems_fl.settings.values import parse_gram_rank

NEURON_CRITERIA = ("rms", "paper")


@dataclass(frozen=True)
class SpaceSettings:
    """How each node finds and sends its good-enough space."""

    space: str = setting(
        'gram',
        '`gram` (logit-space ellipsoid, see docs/method.md; the default), or the '
        "paper's `ball` or `ellipsoid` (Fisher axes, appendix A)",
        one_of(SPACE_KINDS), node=True, user=True)
    eps: float = setting(
        0.4,
        'Q: a model is good enough on a node when its validation accuracy is >= eps. A '
        'node may set its own with `--node-config "eps=0.6"`',
        in_range(0.0, 1.0, "a target accuracy between 0 and 1"), node=True, user=True)
    num_directions: int = setting(
        500,
        'p, surface samples per tested radius',
        positive, node=True)
    r_max: float = setting(
        0.0,
        'upper end of the radius bisection, in the units of the space kind\'s radius; 0: the '
        'kind\'s own bound (see docs/method.md)',
        at_least(0, "0: the space kind's own bound"), node=True, lab=True)
    delta: float = setting(
        0.01,
        'bisection stops at this width',
        positive, node=True, lab=True)
    ellipsoid_c: float = setting(
        0.1,
        'c of appendix A: shortest axis relative to the longest',
        in_range(0, 1, "it is the shortest ellipsoid axis relative to the longest (appendix A's c)", closed="right"), node=True, lab=True)
    ellipsoid_floor: str = setting(
        'quantile',
        'ellipsoid axes `max(F_ref / F_i, c)`: `quantile` takes F_ref as the 5 % quantile '
        "of the nonzero Fisher entries; `paper` is appendix A's min over all entries, "
        'which collapses every axis to c when some entry is 0',
        one_of(ELLIPSOID_FLOORS), node=True, lab=True)
    eps_neuron: float = setting(
        0.1,
        "eps_j: a perturbed neuron is good enough while its outputs on the node's "
        'validation inputs deviate by at most this',
        positive, node=True, lab=True)
    neuron_criterion: str = setting(
        'rms',
        "deviation of a neuron's outputs: `rms` (root mean square) or `paper` (L2 norm "
        "divided by N, the paper's eq. 3)",
        one_of(NEURON_CRITERIA), node=True, lab=True)
    neuron_delta: float = setting(
        0.01,
        'bisection width of the per-neuron radius search',
        positive, node=True, lab=True)
    gram_rank: int | str = setting(
        'auto',
        "`gram` only: how a node's Gram matrix travels. 0: the whole matrix (upper triangle, "
        'float32; exact). r > 0: a rank-r factor `F` (float16 vectors, power-of-two scales) '
        'and the diagonal of the rest, `G ~ F F^T + diag(G - F F^T)` (fewer bytes, a coarser '
        'space); beside label moments, `F` is of the within-class scatter and the class means '
        'come exactly from the moments. `auto` (the default): rank r = max(32, ceil(size / 16)) (50 for 784 features) '
        'where the matrix is larger than 2 r + 1, else the whole matrix (digits travels whole); '
        'the whole matrix under secure-aggregation and DP, which sum it whole anyway, and for the '
        'MLP, whose output layer lost up to 1.1 points with it (set a rank to compress it). '
        'results/README.md, "1b", has the bytes against accuracy',
        parses(parse_gram_rank), node=True)
    label_moments: bool = setting(
        True,
        '`gram` only: nodes also send their label moments (mean of `e_y [x, 1]^T` over their '
        'training rows, one model\'s size) and class counts; every `gram-point` but `closed-form` '
        'needs them',
        node=True, lab=True)
    class_grams: str = setting(
        'auto',
        '`gram` with `label-moments`: nodes also send the Gram matrix of each class they hold '
        '(mean of `x~ x~^T` over its rows), from which the server fits the `gaussian` point. '
        'Up to 256 inputs whole (float32); above, with `gram-rank` above 0 or `auto`, each '
        'class\'s covariance as `gram-rank`\'s rank-r factor (float16) and the diagonal of the '
        'rest, the mean from the label moments (82 KB per class at 784 pixels, rank 50: 341,080 against 177,185 bytes per node of 2 classes). '
        '`auto` (the default): wherever one of those forms applies, and whenever '
        '`gram-point=gaussian`; not for layers above 256 inputs with `gram-rank=0`, where '
        'each class would send a whole 1.2 MB matrix (`true` sends them), nor for '
        "`model='random-features'` (a factor per class at D + 1 inputs; "
        'docs/random-features.md). Under '
        '`secure-aggregation` they travel whole through SecAgg+ as sums per class, with '
        '`auto` up to 256 inputs; not with `dp-epsilon`',
        one_of(CLASS_GRAMS), node=True, lab=True)
    class_components: int = setting(
        4,
        '`class-grams` sent whole (up to 256 inputs: the MLP\'s output layer): each node '
        'splits the rows of each class it holds into up to this many k-means clusters (of '
        'at least 50 rows and twice the layer\'s size each) and sends one Gram matrix per '
        'cluster with its row count; the `mixture` point draws its virtual rows from them, '
        'a mixture of Gaussians per class, and `gaussian` adds them up (README "Good-enough '
        'spaces"). The factor form (above 256 inputs) sends one per class; with '
        '`server-grams=sums` the server adds a class\'s clusters up. 1: one per class',
        at_least(1, "1: one Gram matrix per class"), node=True, lab=True)
