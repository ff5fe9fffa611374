"""Server-side aggregation of one hidden layer from per-neuron good-enough balls.

Paper, section 3.2, step (3): every node ``k`` sends, for each neuron ``i`` of hidden
layer ``j``, a ball ``H^k_{j,i}`` over that neuron's ``[incoming weights; bias]``. The
server builds the aggregate layer so that every node's every neuron ball contains some
output neuron, by greedily intersecting tuples of the cartesian product
``H^1_{j,.} x ... x H^K_{j,.}`` (one neuron per node); neurons that intersect nothing
are kept as they are. To avoid the exponential product, the paper clusters all neurons
of all nodes with k-means into ``m_eps`` clusters and only intersects within a cluster.

What :func:`merge_layer` does, precisely:

1. Stack the neurons of all nodes in node-major order (node 0's neurons 0..H_0-1, then
   node 1's, ...) and run scikit-learn ``KMeans(n_clusters=min(m_eps, N),
   random_state=seed, n_init=n_init)`` on the rows (the ball centers).
2. Visit **every** non-empty cluster, in increasing label order, label 0 included (the
   authors' loop skipped it).
3. Within a cluster, build groups greedily. Neurons are taken in (node, neuron) order;
   the first unassigned one seeds a group. Then, for each *other* node in increasing
   index order, that node's unassigned neurons of the cluster are tried, nearest (to
   the group's current common point) first; the first one that joins ends that node's
   turn. A group therefore holds at most one neuron per node, like a tuple of the
   paper's cartesian product. A candidate joins only when a common point of the
   group's balls and its own is **verified** with :meth:`Space.contains`; pairwise
   overlap is never enough (three balls can overlap pairwise with no common point).
   The tests, cheapest first:

   a. necessary pre-checks, on the squared center distances of the cluster (one Gram
      product), each with a rounding bound that only ever lets more through: the
      candidate's ball overlaps every member's (``||c_a - c_b|| <= r_a + r_b``), and
      meets every two members' balls as a triple (closed form, see
      :func:`_three_balls_meet`);
   b. the group's current point (verified in the members' balls) already lies in the
      candidate's ball: joined, the point is kept;
   c. ``method="dual"`` (default): the dual test :func:`_ball_dual`, exact for balls:
      ``max over the simplex of 1/2 l^T D2 l - l^T r^2 > 0`` proves the balls disjoint
      (candidate rejected), and otherwise its weighted mean ``sum_k l_k c_k`` is a
      common point, accepted once :meth:`Space.contains` verifies it. It costs
      ``O(g^2)`` per step, independent of the dimension;
   d. :func:`find_intersection` on the group plus the candidate, joined iff
      ``found``; reached only when (c) is inconclusive (near-tangent balls, radius-0
      members) or with ``method="dykstra"``, which skips (c) for every candidate.
4. A group of two or more neurons becomes one output neuron, always verified in every
   member's ball: the mean of the centers if it is inside them all (model averaging,
   which is also find_intersection's answer then); else find_intersection's point
   (nearest to the mean in the shrunk intersection) when the last member joined
   through it, or when ``method="dykstra"``/``polish_max_iter > 0`` asks for it; else
   (``method="dual"``) the power center, the common point with the largest worst-case
   margin ``min_k (r_k^2 - ||w - c_k||^2)``; failing all, the last verified point.
   A group of one is kept as that neuron's center, bit for bit.
5. Output neurons are ordered by their group's first member (node, neuron), which is
   the group's seed. With no merges at all the layer is the nodes' neurons
   concatenated in node order.

Why the dual test and not find_intersection for every candidate: on 100 nodes x 100
neurons (d = 785, benchmarks/layer_merge.py) ``method="dykstra"``, with the same
pre-checks, made 6316 find_intersection calls (2934 without a common point; near-tangent
sets run Dykstra for up to ``max_iter`` sweeps of Python-level projections) and took
185 s on a shared 2-core machine; ``method="dual"`` made none and took ~7 s, k-means
included, for the same width (6134; 20 and 50 nodes: 1332 vs 1333 and 3119 vs 3120).

Guarantees (deterministic for a given input and ``seed``; with ``threads=None`` also
for a given core count):

- every input neuron's ball contains the output neuron of its group (the paper's
  condition ``for all i, k there is i' with f_G,i' in H^k_{j,i}``), checked with
  :meth:`Space.contains`;
- ``width >= number of non-empty clusters`` (each cluster yields at least one output
  neuron), and more precisely ``width >= L = sum over clusters c of max_k n_{c,k}``,
  ``n_{c,k}`` the number of node ``k``'s neurons in cluster ``c``, because a group
  holds at most one neuron per node. ``L`` is attained when every ball contains every
  center of its cluster (very large eps); ``width <= N``, attained at radius 0 with
  distinct centers. ``m_eps`` bounds the width from below only through the number of
  non-empty clusters (``<= min(m_eps, N)``; k-means can leave clusters empty when
  neurons coincide);
- *not* guaranteed: that larger radii (larger eps) never widen the layer. They
  usually narrow it, but the greedy first-fit can take a partner that only the larger
  balls allow and so strand neurons that the smaller balls had paired (a 4-neuron
  case is in the tests; about 1 random small case in 150 shows it). Nor is the width
  monotone in ``m_eps``, which changes the clustering itself.

Cost: k-means is ``O(N m d)`` per Lloyd iteration plus the k-means++ seeding; the
greedy pass is one ``(n_c, d) @ (d, n_c)`` product per cluster of ``n_c`` neurons,
then ``O(n_c^2)`` mask work, ``O(g n_c)`` per join for the triple masks, ``O(g^2)`` per
dual step and ``O(g d)`` per verification.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from gems_fl.geometry._checks import check_option, check_scalar
from gems_fl.geometry.intersect import find_intersection
from gems_fl.geometry.spaces import Space, within_radius

METHODS = ("dual", "dykstra")

# Pairwise Frank-Wolfe steps of the dual test per candidate (each O(g^2)).
_DUAL_MAX_ITER = 500


@dataclass
class MergeCounts:
    """What the greedy pass of :func:`merge_layer` did, counted.

    Attributes
    ----------
    intersection_calls : int
        Calls to :func:`find_intersection`: candidate tests that no cheaper check
        settled, plus merged points asked of it (see ``method``,
        ``polish_max_iter``).
    failed_calls : int
        Of those, the ones that verified no common point (the candidate stays out).
    pair_rejections : int
        (group, candidate) pairs ruled out by the pairwise pre-check.
    triple_rejections : int
        (group, candidate) pairs ruled out by the three-ball pre-check.
    contains_accepts : int
        Candidates accepted because their ball already contained the group's point.
    dual_rejections : int
        Candidates discarded because the dual test proved them disjoint from the group.
    dual_accepts : int
        Candidates accepted on the dual test's weighted mean (or a radius-0 member's
        center), verified with ``Space.contains``.
    mean_points : int
        Merged groups whose point is the mean of their centers (inside every ball).
    power_points : int
        Merged groups whose point is the power center from the dual test.
    """

    intersection_calls: int = 0
    failed_calls: int = 0
    pair_rejections: int = 0
    triple_rejections: int = 0
    contains_accepts: int = 0
    dual_rejections: int = 0
    dual_accepts: int = 0
    mean_points: int = 0
    power_points: int = 0


_COUNT_NAMES = tuple(f.name for f in fields(MergeCounts))


@dataclass(kw_only=True)
class LayerMerge(MergeCounts):
    """The aggregated hidden layer and how it was built, with :class:`MergeCounts`.

    Attributes
    ----------
    weights : np.ndarray
        Aggregated neurons as rows, shape ``(H', d)``; each row is ``[incoming weights;
        bias]``.
    groups : list of list of (int, int)
        Per output neuron, the ``(node index, neuron index)`` pairs merged into it, in
        the order they joined (the first is the seed, the smallest pair of the group).
        Length-1 groups are neurons kept unchanged.
    group_clusters : list of int
        Per output neuron, the k-means label of its cluster.
    num_intersected_groups : int
        Groups of two or more neurons merged into one verified common point.
    num_kept_alone : int
        Neurons that intersected nothing and were kept unchanged.
    clusters_visited : int
        Clusters the greedy pass processed; equals ``num_nonempty_clusters`` (every
        cluster, label 0 included).
    num_nonempty_clusters : int
        Distinct k-means labels among the neurons.
    num_clusters : int
        ``m_eps`` as requested.
    num_clusters_used : int
        ``min(num_clusters, N)``, the ``n_clusters`` given to k-means.
    num_inputs : int
        Total input neurons ``N`` over all nodes.
    seconds : dict
        Wall time of the ``"kmeans"`` and ``"greedy"`` phases (not in :meth:`to_dict`,
        which is deterministic).
    """

    weights: np.ndarray
    groups: list[list[tuple[int, int]]]
    group_clusters: list[int]
    num_intersected_groups: int
    num_kept_alone: int
    clusters_visited: int
    num_nonempty_clusters: int
    num_clusters: int
    num_clusters_used: int
    num_inputs: int
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def width(self) -> int:
        """``H'``, the number of output neurons."""
        return int(self.weights.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly counts (no arrays, no group lists)."""
        sizes = [len(g) for g in self.groups]
        return {
            "width": self.width,
            "num_inputs": int(self.num_inputs),
            "num_intersected_groups": int(self.num_intersected_groups),
            "num_kept_alone": int(self.num_kept_alone),
            "neurons_merged": int(sum(s for s in sizes if s >= 2)),
            "largest_group": int(max(sizes)) if sizes else 0,
            "clusters_visited": int(self.clusters_visited),
            "num_nonempty_clusters": int(self.num_nonempty_clusters),
            "num_clusters": int(self.num_clusters),
            "num_clusters_used": int(self.num_clusters_used),
            **{name: int(getattr(self, name)) for name in _COUNT_NAMES},
        }


@dataclass(frozen=True)
class MergeOptions:
    """The tuning options of :func:`merge_layer` (see its parameters), validated."""

    max_iter: int = 2000
    n_init: int = 1
    shrink: float = 1e-3
    polish_max_iter: int = 0
    threads: int | None = 1
    method: str = "dual"

    def __post_init__(self) -> None:
        checked = {
            "max_iter": check_scalar(self.max_iter, "max_iter", int, low=1),
            "n_init": check_scalar(self.n_init, "n_init", int, low=1),
            "shrink": check_scalar(self.shrink, "shrink", float, low=0, high=1,
                                   closed="left"),
            "polish_max_iter": check_scalar(self.polish_max_iter, "polish_max_iter",
                                            int, low=0),
            "threads": None if self.threads is None
            else check_scalar(self.threads, "threads", int, low=1),
            "method": check_option(self.method, "method", METHODS),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

def _validate(
    node_neurons: Sequence[tuple[Any, Any]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Check the input; return stacked centers, radii, node and neuron indices."""
    if isinstance(node_neurons, (str, bytes)) or not isinstance(
        node_neurons, Sequence
    ):
        raise TypeError(
            "node_neurons must be a list of (centers, radii) tuples, one per node"
        )
    if len(node_neurons) == 0:
        raise ValueError("node_neurons is empty: pass one (centers, radii) per node")
    layers: list[tuple[np.ndarray, np.ndarray]] = []
    for k, item in enumerate(node_neurons):
        layers.append(_check_node(k, item, layers[0][0].shape[1] if layers else None))
    if layers[0][0].shape[1] == 0:
        raise ValueError("neurons have d=0 parameters: expected d = d_in + 1 >= 1")
    c = np.concatenate([centers for centers, _ in layers], axis=0)
    if c.shape[0] == 0:
        raise ValueError("no neurons: every node sent an empty layer")
    sizes = [centers.shape[0] for centers, _ in layers]
    return (
        c,
        np.concatenate([radii for _, radii in layers]),
        np.concatenate([np.full(h, k, dtype=np.int64) for k, h in enumerate(sizes)]),
        np.concatenate([np.arange(h, dtype=np.int64) for h in sizes]),
    )


def _check_node(k: int, item: Any, d: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Node ``k``'s ``(centers, radii)`` as float64 arrays; ``d``: node 0's width."""
    try:
        centers, radii = item
    except (TypeError, ValueError):
        raise TypeError(f"node_neurons[{k}] must be a (centers, radii) pair") from None
    centers = np.asarray(centers, dtype=np.float64)
    radii = np.asarray(radii, dtype=np.float64)
    if centers.ndim != 2:
        raise ValueError(
            f"node {k}: centers must be 2-D (H_k, d) with one neuron "
            f"[incoming weights; bias] per row, got shape {centers.shape}"
        )
    if radii.shape != (centers.shape[0],):
        raise ValueError(
            f"node {k}: radii has shape {radii.shape}, expected "
            f"({centers.shape[0]},): one radius per neuron (row of centers)"
        )
    if d is not None and centers.shape[1] != d:
        raise ValueError(
            f"node {k}: neurons have d={centers.shape[1]} parameters but node 0's "
            f"have d={d}: every node must send the same layer (same input width)"
        )
    if not np.all(np.isfinite(centers)):
        raise ValueError(f"node {k}: centers contain non-finite values")
    if not np.all(np.isfinite(radii)):
        raise ValueError(f"node {k}: radii contain non-finite values")
    if np.any(radii < 0):
        bad = int(np.flatnonzero(radii < 0)[0])
        raise ValueError(
            f"node {k}: radii must be >= 0, neuron {bad} has {radii[bad]!r}"
        )
    return centers, radii


def _cluster(c: np.ndarray, m: int, seed: int, n_init: int) -> np.ndarray:
    if m == 1:
        return np.zeros(c.shape[0], dtype=np.int64)
    with warnings.catch_warnings():
        # Fewer distinct neurons than clusters: some clusters end up empty, which the
        # result reports (num_nonempty_clusters); not worth a warning.
        warnings.filterwarnings(
            "ignore", message="Number of distinct clusters", category=ConvergenceWarning
        )
        km = KMeans(n_clusters=m, random_state=seed, n_init=n_init).fit(c)
    return km.labels_.astype(np.int64)


def _squared_distances(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared distances between the rows of ``c`` and a bound on their error.

    From the Gram matrix of the centred rows (one ``(n, d) @ (d, n)`` product). The
    bound covers the dot products (``~d`` ulps of the squared norms) and the rounding
    of the centring itself (a vector error of at most ``delta = 4 sqrt(d) eps
    max|c|`` per difference, hence ``2 D delta + delta^2`` on ``D^2``), with a
    factor 2 of headroom.
    """
    n, d = c.shape
    eps = np.finfo(np.float64).eps
    c0 = c - c.mean(axis=0)
    sq = np.einsum("ij,ij->i", c0, c0)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (c0 @ c0.T), 0.0)
    np.fill_diagonal(d2, 0.0)
    norms = np.sqrt(sq)
    delta = 4.0 * np.sqrt(d) * eps * float(np.abs(c).max(initial=0.0))
    err2 = 2.0 * (
        (d + 2) * eps * (sq[:, None] + sq[None, :])
        + 2.0 * (norms[:, None] + norms[None, :]) * delta
        + delta * delta
    )
    return d2, err2 + np.finfo(np.float64).tiny


def _three_balls_meet(
    d2_ab: np.ndarray,
    d2_aj: np.ndarray,
    d2_bj: np.ndarray,
    r_a: np.ndarray,
    r_b: np.ndarray,
    r_j: np.ndarray,
    err2: np.ndarray,
) -> np.ndarray:
    """Necessary test that three balls have a common point (broadcasts elementwise).

    The three-ball case of :func:`_ball_dual`, in closed form: the balls are disjoint
    iff ``phi(l) = 1/2 l^T D2 l - l^T r^2 > 0`` for some ``l`` in the simplex. With
    ``l = (1 - s - t, s, t)``, ``phi`` is a quadratic in ``(s, t)`` whose Hessian
    ``[[-2 A, C - A - B], [C - A - B, -2 B]]`` (``A = d2_ab, B = d2_aj, C = d2_bj``) has
    determinant ``4 A B - (A + B - C)^2 = 16 area^2``: negative definite unless the
    centers are collinear. The stationary point, clipped to the simplex, is evaluated;
    a value above the error margin proves the three balls disjoint. (When every pair
    overlaps, the maximum of ``phi`` over the simplex is interior, so this finds every
    disjoint triple of non-collinear centers.)

    ``err2`` bounds the error of the squared distances: ``phi`` moves by at most
    ``err2 / 2`` (the weights of the three products sum to at most 1/3); the margin adds
    ``1e-12`` of the scale for the arithmetic. The test may answer True for three balls
    that do not meet, never False for three that do.
    """
    a, b, c = d2_ab, d2_aj, d2_bj
    ra2, rb2, rj2 = r_a * r_a, r_b * r_b, r_j * r_j
    gs = a - rb2 + ra2  # gradient of phi at l = (1, 0, 0) along s and t
    gt = b - rj2 + ra2
    m = a + b - c
    det = 4.0 * a * b - m * m
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (2.0 * b * gs - m * gt) / det
        t = (2.0 * a * gt - m * gs) / det
    good = det > 0
    s = np.where(good, s, 1.0 / 3.0)
    t = np.where(good, t, 1.0 / 3.0)
    l0, l1, l2 = np.maximum(1.0 - s - t, 0.0), np.maximum(s, 0.0), np.maximum(t, 0.0)
    tot = l0 + l1 + l2
    l0, l1, l2 = l0 / tot, l1 / tot, l2 / tot
    phi = l0 * l1 * a + l0 * l2 * b + l1 * l2 * c - (l0 * ra2 + l1 * rb2 + l2 * rj2)
    scale = np.maximum(np.maximum(a, b), c) + np.maximum(np.maximum(ra2, rb2), rj2)
    return ~(phi > 0.5 * err2 + 1e-12 * scale)


def _ball_dual(
    d2: np.ndarray,
    r2: np.ndarray,
    lam0: np.ndarray,
    err2: float,
    max_iter: int,
    optimize: bool = False,
) -> tuple[str, np.ndarray, int]:
    """Decide whether balls meet from their squared center distances alone.

    Balls ``B(c_k, r_k)`` have a common point iff

        ``max over lam in the simplex of  phi(lam) = 1/2 lam^T D2 lam - lam^T r^2 <= 0``

    (Sion's minimax theorem on ``sum_k lam_k (||w - c_k||^2 - r_k^2)``, convex in
    ``w`` and linear in ``lam``; for fixed ``lam`` the minimum over ``w`` is at the
    weighted mean ``w = sum_k lam_k c_k``). ``phi`` is concave on the simplex, since a
    Euclidean distance matrix is negative semidefinite on zero-sum vectors. Hence, for
    any ``lam``: ``phi(lam) > 0`` proves the balls disjoint, and the weighted mean,
    whose squared power distances ``||w - c_k||^2 - r_k^2 = (D2 lam)_k - 1/2 lam^T D2
    lam - r_k^2`` are known from ``D2`` alone, is a common point if their maximum
    ``P(lam)`` is negative. ``P(lam) - phi(lam)`` is the Frank-Wolfe gap, which pairwise
    Frank-Wolfe steps with exact line search (weight moved from the least to the most
    violated ball) drive to zero. Each step is ``O(g^2)`` for ``g`` balls, with no
    dependence on the dimension ``d``.

    ``err2`` bounds the error of the entries of ``d2``: ``phi`` and ``P`` are then off
    by at most ``err2 / 2`` and ``3 err2 / 2``; both tests keep that margin.

    With ``optimize`` the steps go on after the first weighted mean inside, until the
    gap is below ``1e-4`` of ``|phi|``: ``lam @ centers`` then approximates the
    *power center* ``argmin_w max_k (||w - c_k||^2 - r_k^2)``, the common point with
    the largest worst-case squared margin (its margin within 0.01 % of the best).

    Returns ``(verdict, lam, steps)`` with verdict ``"empty"`` (proven disjoint),
    ``"point"`` (the weighted mean ``lam @ centers`` should be inside every ball, to be
    verified by the caller) or ``"unknown"`` (within the error margin of tangency, or
    out of steps).
    """
    scale = float(d2.max(initial=0.0) + r2.max(initial=0.0))
    tol = 1e-12 * scale
    lam = lam0.astype(np.float64, copy=True)
    inside = False
    for step in range(max_iter):
        al = d2 @ lam
        q = 0.5 * float(lam @ al)
        grad = al - r2
        phi = q - float(lam @ r2)
        if phi > 0.5 * err2 + tol:
            return "empty", lam, step
        big = int(np.argmax(grad))
        inside = bool(grad[big] - q < -(1.5 * err2 + tol))
        if inside and not optimize:
            return "point", lam, step
        support = np.flatnonzero(lam > 0)
        small = int(support[np.argmin(grad[support])])
        gap = float(grad[big] - grad[small])
        if gap <= max(1e-15 * scale, (1e-4 * abs(phi)) if optimize else 0.0):
            break
        curv = float(d2[big, small])
        t = float(lam[small])
        if curv > 0:
            t = min(t, gap / (2.0 * curv))
        lam[big] += t
        lam[small] -= t
    else:
        step = max_iter
    if optimize:
        al = d2 @ lam
        inside = bool((al - r2).max() - 0.5 * float(lam @ al) < -(1.5 * err2 + tol))
    return ("point" if inside else "unknown"), lam, step


@dataclass
class _Cluster:
    """One cluster's neurons, indexed locally ``0..n-1`` in (node, neuron) order.

    ``members`` are the global indices; ``d2``/``err2`` the squared center distances
    and their rounding bound (:func:`_squared_distances`); ``compatible`` the pairwise
    pre-check ``||c_a - c_b|| <= r_a + r_b``, which never fails a true overlap.
    """

    members: np.ndarray
    c: np.ndarray
    r: np.ndarray
    r2: np.ndarray
    node: np.ndarray
    d2: np.ndarray
    err2: np.ndarray
    compatible: np.ndarray

    @classmethod
    def of(
        cls, c: np.ndarray, r: np.ndarray, node: np.ndarray, members: np.ndarray
    ) -> _Cluster:
        c, r, node = c[members], r[members], node[members]
        d2, err2 = _squared_distances(c)
        rr = r[:, None] + r[None, :]
        return cls(members, c, r, r * r, node, d2, err2, d2 <= rr * rr + err2)

    def global_indices(self, local: list[int]) -> list[int]:
        return [int(self.members[i]) for i in local]

    def triples_meet(self, prev: list[int], j: int, left: np.ndarray) -> np.ndarray:
        """Per candidate in ``left``: meets ``j`` and every ``prev`` member as a triple."""
        prev_ = np.array(prev)
        d2, err2, r = self.d2, self.err2, self.r
        e_pj = err2[np.ix_(prev_, [j])]
        e_pl = err2[np.ix_(prev_, left)]
        e_jl = err2[j, left][None, :]
        return _three_balls_meet(
            d2[np.ix_(prev_, [j])],
            d2[np.ix_(prev_, left)],
            d2[j, left][None, :],
            r[prev_][:, None],
            r[j],
            r[left][None, :],
            np.maximum(np.maximum(e_pj, e_pl), e_jl),
        ).all(axis=0)


@dataclass
class _Group:
    """A group being grown: local members, dual weights and a verified common point.

    ``how`` says how the last member joined: ``"seed"``, ``"contains"``, ``"dual"`` or
    ``"solve"`` (through :func:`find_intersection`, whose point it then is).
    """

    members: list[int]
    lam: np.ndarray
    point: np.ndarray
    how: str


def _node_blocks(node: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """``order`` (ascending local indices) split into runs of one node each."""
    starts = np.flatnonzero(np.r_[True, node[order[1:]] != node[order[:-1]]])
    return np.split(order, starts[1:])


class _Greedy:
    """The greedy pass over the clusters: stacked neurons, options and counters."""

    def __init__(
        self, c: np.ndarray, r: np.ndarray, node: np.ndarray, options: MergeOptions
    ) -> None:
        self.c, self.r, self.node = c, r, node
        self.options = options
        self.counts = MergeCounts()
        self._spaces: dict[int, Space] = {}

    def space(self, i: int) -> Space:
        s = self._spaces.get(i)
        if s is None:
            s = self._spaces[i] = Space(self.c[i], float(self.r[i]))
        return s

    def verified(self, members: list[int], w: np.ndarray) -> bool:
        """Whether ``w`` lies in every member's ball (:meth:`Space.contains`)."""
        dist = np.linalg.norm(self.c[members] - w[None, :], axis=1)
        # Vectorised screen with Space.contains's test; the loop is the proof.
        if not np.all(within_radius(dist, self.r[members])):
            return False
        return all(self.space(i).contains(w) for i in members)

    def solve(self, members: list[int], max_iter: int) -> np.ndarray | None:
        """A verified common point of the members' balls, or None."""
        self.counts.intersection_calls += 1
        res = find_intersection(
            [self.space(i) for i in members],
            max_iter=max_iter,
            shrink=self.options.shrink,
            fallback="mean",
        )
        if not res.found:
            self.counts.failed_calls += 1
        return res.point if res.found else None

    def cluster(self, members: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
        """Greedy groups of one cluster's members (global indices, ascending)."""
        cl = _Cluster.of(self.c, self.r, self.node, members)
        assigned = np.zeros(len(members), dtype=bool)
        return [
            self.grow(cl, s, assigned) for s in range(len(members)) if not assigned[s]
        ]

    def grow(
        self, cl: _Cluster, s: int, assigned: np.ndarray
    ) -> tuple[list[int], np.ndarray]:
        """The group seeded by local neuron ``s``: global members, merged neuron.

        Each later node in turn offers its viable neurons, nearest to the group's
        current point first; the first that joins ends the node's turn.
        """
        assigned[s] = True
        group = _Group([s], np.ones(1), cl.c[s], "seed")
        viable = self.candidates(cl, s, assigned)
        for block in _node_blocks(cl.node, np.flatnonzero(viable)):
            for j in self.nearest_first(cl, block[viable[block]], group.point):
                if self.join(cl, group, j, viable):
                    assigned[j] = True
                    break
        point = self.polish(cl, group) if len(group.members) >= 2 else group.point
        return cl.global_indices(group.members), np.array(point, copy=True)

    def candidates(self, cl: _Cluster, s: int, assigned: np.ndarray) -> np.ndarray:
        """Mask of the neurons worth a test for seed ``s``: unassigned, from another
        node, overlapping ``s`` pairwise."""
        others = ~assigned & (cl.node != cl.node[s])
        viable = others & cl.compatible[s]
        self.counts.pair_rejections += int(others.sum() - viable.sum())
        return viable

    @staticmethod
    def nearest_first(cl: _Cluster, block: np.ndarray, point: np.ndarray) -> list[int]:
        """``block`` by distance to ``point``; stable on ties (lower neuron first)."""
        if block.size > 1:
            dist = np.linalg.norm(cl.c[block] - point[None, :], axis=1)
            block = block[np.argsort(dist, kind="stable")]
        return [int(j) for j in block]

    def join(
        self, cl: _Cluster, group: _Group, j: int, viable: np.ndarray
    ) -> bool:
        """Add ``j`` to ``group`` if a common point is verified; narrow ``viable``."""
        joined = self.try_join(cl, group, j)
        if joined is None:
            return False
        group.lam, group.point, group.how = joined
        self.narrow(cl, group.members, j, viable)
        group.members.append(j)
        return True

    def narrow(
        self, cl: _Cluster, prev: list[int], j: int, viable: np.ndarray
    ) -> None:
        """After ``j`` joined ``prev``: keep the candidates that are not of ``j``'s
        node, overlap ``j`` and meet ``j`` with each earlier member as a triple."""
        viable &= cl.node != cl.node[j]
        before = int(viable.sum())
        viable &= cl.compatible[j]
        self.counts.pair_rejections += before - int(viable.sum())
        left = np.flatnonzero(viable)
        # Nodes before j's were visited already: no need to test them.
        left = left[cl.node[left] > cl.node[j]]
        if left.size:
            meet = cl.triples_meet(prev, j, left)
            viable[left] = meet
            self.counts.triple_rejections += int(left.size - meet.sum())

    def try_join(
        self, cl: _Cluster, group: _Group, j: int
    ) -> tuple[np.ndarray, np.ndarray, str] | None:
        """``(dual weights, verified common point, how)`` of ``group + [j]``, or None.

        In order: the group's point may already be in ``j``'s ball (``"contains"``);
        with ``method="dual"``, :meth:`dual_test` may prove the balls disjoint (None)
        or give a verified common point (``"dual"``); otherwise
        :func:`find_intersection` decides (``"solve"``).
        """
        trial = group.members + [j]
        trial_global = cl.global_indices(trial)
        lam = np.append(group.lam, 0.0)
        if self.verified(trial_global[-1:], group.point):
            self.counts.contains_accepts += 1
            return lam, group.point, "contains"
        if self.options.method == "dual":
            verdict, lam, point = self.dual_test(cl, trial, trial_global, lam)
            if verdict == "empty":
                return None
            if verdict == "point":
                return lam, point, "dual"
        found = self.solve(trial_global, self.options.max_iter)
        return None if found is None else (lam, found, "solve")

    def dual_test(
        self, cl: _Cluster, trial: list[int], trial_global: list[int], lam: np.ndarray
    ) -> tuple[str, np.ndarray, np.ndarray | None]:
        """``(verdict, lam, point)``: ``"empty"`` (proven disjoint), ``"point"``
        (``point`` verified in every ball) or ``"unknown"``."""
        zero = [i for i in trial if cl.r2[i] == 0.0]
        if zero:
            # A radius-0 ball is its center: the only possible common point.
            z = cl.c[zero[0]]
            if self.verified(trial_global, z):
                self.counts.dual_accepts += 1
                return "point", lam, z.copy()
            return "unknown", lam, None
        rows = np.array(trial)
        verdict, lam, _ = _ball_dual(
            cl.d2[rows][:, rows], cl.r2[rows], lam, float(cl.err2[rows][:, rows].max()),
            _DUAL_MAX_ITER,
        )
        if verdict == "empty":
            self.counts.dual_rejections += 1
            return "empty", lam, None
        if verdict == "point":
            w = lam @ cl.c[trial]
            if self.verified(trial_global, w):
                self.counts.dual_accepts += 1
                return "point", lam, w
        return "unknown", lam, None

    def polish(self, cl: _Cluster, group: _Group) -> np.ndarray:
        """The merged neuron of a finished group, verified.

        1. The mean of the group's centers when it is inside every ball: model
           averaging, and exactly :func:`find_intersection`'s answer in that case
           (its first step), obtained here without a call.
        2. :func:`find_intersection`'s point for the whole group, i.e. the point of
           the (shrunk) intersection nearest to the mean: kept as is when the last
           member joined through that very call; otherwise computed with
           ``max_iter`` sweeps for ``method="dykstra"``, or ``polish_max_iter``
           sweeps (0: skipped) for ``method="dual"``.
        3. (``method="dual"``) The power center (:meth:`power_center`).
        4. Failing all (rounding at tangency, or budgets), the incremental point,
           verified when the last member joined.
        """
        opts = self.options
        members = cl.global_indices(group.members)
        mean = cl.c[group.members].mean(axis=0)
        if self.verified(members, mean):
            self.counts.mean_points += 1
            return mean
        if group.how == "solve":
            return group.point
        budget = opts.max_iter if opts.method == "dykstra" else opts.polish_max_iter
        if budget > 0:
            found = self.solve(members, budget)
            if found is not None:
                return found
        if opts.method == "dual" and np.all(cl.r2[group.members] > 0):
            power = self.power_center(cl, group, members)
            if power is not None:
                return power
        return group.point

    def power_center(
        self, cl: _Cluster, group: _Group, members: list[int]
    ) -> np.ndarray | None:
        """The dual test run to convergence: the common point with the largest
        worst-case squared margin ``min_k (r_k^2 - ||w - c_k||^2)``, if verified."""
        local = group.members
        sub = np.ix_(local, local)
        verdict, lam, _ = _ball_dual(
            cl.d2[sub], cl.r2[local], group.lam, float(cl.err2[sub].max()),
            _DUAL_MAX_ITER, optimize=True,
        )
        if verdict == "point":
            w = lam @ cl.c[local]
            if self.verified(members, w):
                self.counts.power_points += 1
                return w
        return None


def merge_layer(
    node_neurons: Sequence[tuple[Any, Any]],
    *,
    num_clusters: int,
    seed: int,
    max_iter: int = 2000,
    n_init: int = 1,
    shrink: float = 1e-3,
    polish_max_iter: int = 0,
    threads: int | None = 1,
    method: str = "dual",
) -> LayerMerge:
    """Aggregate hidden layer ``j`` from every node's per-neuron good-enough balls.

    See the module docstring for the algorithm and its guarantees.

    Parameters
    ----------
    node_neurons : sequence of (centers, radii)
        One pair per node ``k``: ``centers`` of shape ``(H_k, d)``, each row one
        neuron's ``[incoming weights; bias]`` (``d = d_in + 1``, the same for every
        node; ``H_k`` may differ and may be 0), and ``radii`` of shape ``(H_k,)``,
        each ``>= 0``. A radius-0 neuron is the single point of its center: it can
        only merge with neurons whose balls contain that center.
    num_clusters : int
        ``m_eps``, the number of k-means clusters, ``>= 1``; capped at the total
        number of neurons ``N``.
    seed : int
        ``random_state`` of k-means; the result is deterministic for a given seed
        (and k-means thread count, see ``threads``).
    max_iter : int
        Per :func:`find_intersection` call, the Dykstra sweep budget. Its fallback is
        ``"mean"`` (no subgradient descent): a candidate whose common point Dykstra
        cannot find within the budget is simply not merged.
    n_init : int
        k-means restarts (scikit-learn's ``n_init``); 1 is scikit-learn's ``"auto"``
        for k-means++ seeding.
    shrink : float
        Passed to :func:`find_intersection`: radii are shrunk by ``1 - shrink`` while
        projecting so that the returned point verifies inside the true balls.
    polish_max_iter : int
        ``method="dual"`` only: when ``> 0``, a merged group whose mean is not inside
        every ball gets :func:`find_intersection`'s point (nearest to the mean) with
        this sweep budget instead of the power center (which it falls back to). 0
        (default) makes no such call: thin intersections can take Dykstra hundreds of
        sweeps, which dominated the run time at 100 x 100 neurons.
    threads : int or None
        BLAS/OpenMP threads for k-means; ``None`` leaves the libraries' default (all
        cores). Default 1: labels that cannot depend on the core count, and a steady
        run time on a shared machine. Measured on 2 cores for 10 000 x 785 neurons
        and 150 clusters: idle machine, 1 thread 3.9 s vs 2 threads 2.3 s; one core
        busy with another process, 4.0 s vs 6.7 s (OpenMP threads wait on the busy
        core). Pass ``None`` on a dedicated multi-core server. The greedy pass always
        runs single-threaded (its products are tiny).
    method : {"dual", "dykstra"}
        How a candidate that passed the pre-checks and does not contain the group's
        point is tested: ``"dual"`` (default) the exact dual test first, with
        :func:`find_intersection` only when it is inconclusive; ``"dykstra"``
        :func:`find_intersection` for every such candidate and for every merged point
        (much slower; kept as the reference).

    Returns
    -------
    LayerMerge
        ``weights`` of shape ``(H', d)`` with ``num_nonempty_clusters <= H' <= N``.

    Raises
    ------
    ValueError
        Empty input, non-2-D centers, radii of the wrong shape, mismatched ``d``
        across nodes, negative or non-finite radii, non-finite centers, no neurons at
        all, or an option out of range.
    TypeError
        If ``node_neurons`` is not a sequence of pairs, or an option is not of its
        type (an int, a real number).
    """
    num_clusters = check_scalar(num_clusters, "num_clusters (m_eps)", int, low=1)
    seed = check_scalar(seed, "seed", int)
    options = MergeOptions(max_iter, n_init, shrink, polish_max_iter, threads, method)
    c, r, node, neuron = _validate(node_neurons)
    m = min(num_clusters, c.shape[0])
    greedy = _Greedy(c, r, node, options)
    # k-means runs with ``threads`` BLAS/OpenMP threads (None: the libraries'
    # default). The greedy pass runs single-threaded: its products are tiny, and on a
    # shared machine waiting BLAS threads made them ~20x slower (measured).
    t0 = time.perf_counter()
    with threadpool_limits(limits=options.threads):
        labels = _cluster(c, m, seed, options.n_init)
    t1 = time.perf_counter()
    with threadpool_limits(limits=1):
        # Every label that occurs, 0 included, in increasing order; members ascending
        # in (node, neuron) order.
        built = [
            (group, point, int(label))
            for label in np.unique(labels)
            for group, point in greedy.cluster(np.flatnonzero(labels == label))
        ]
        seconds = {"kmeans": t1 - t0, "greedy": time.perf_counter() - t1}
    # Order output neurons by their seed (the group's smallest (node, neuron) pair).
    built.sort(key=lambda t: t[0][0])
    groups = [[(int(node[i]), int(neuron[i])) for i in g] for g, _, _ in built]
    sizes = [len(g) for g in groups]
    visited = int(np.unique(labels).size)
    return LayerMerge(
        weights=(
            np.stack([p for _, p, _ in built]) if built else np.empty((0, c.shape[1]))
        ),
        groups=groups,
        group_clusters=[lab for _, _, lab in built],
        num_intersected_groups=sum(1 for s in sizes if s >= 2),
        num_kept_alone=sum(1 for s in sizes if s == 1),
        clusters_visited=visited,
        num_nonempty_clusters=visited,
        num_clusters=num_clusters,
        num_clusters_used=m,
        num_inputs=c.shape[0],
        seconds=seconds,
        **asdict(greedy.counts),
    )


def bound_width(merge: LayerMerge, max_width: int, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The merged layer cut to at most ``max_width`` neurons, and what was done.

    Verified groups (two or more neurons with a common point) stay as they are, the
    largest first while they fit in ``max_width - 1``; the neurons kept alone (and any
    group that did not fit) are replaced by the centers of a k-means over them, as many
    as the width left allows (at least one). Those centers lie in no node's neuron
    space: the report counts them as unverified.
    """
    check_scalar(max_width, "max_width", int, low=1)
    sizes = np.array([len(g) for g in merge.groups])
    if len(sizes) <= max_width:
        return merge.weights, {"kept_alone": int(np.sum(sizes == 1)),
                               "reduced_to": int(np.sum(sizes == 1)), "unverified": 0,
                               "groups_reduced": 0, "width": int(len(sizes))}
    grouped = np.flatnonzero(sizes > 1)
    largest_first = grouped[np.argsort(-sizes[grouped], kind="stable")]
    kept = np.sort(largest_first[: max_width - 1])  # merge order among the kept rows
    rest = np.setdiff1d(np.arange(len(sizes)), kept)
    room = max_width - len(kept)
    kmeans = KMeans(n_clusters=room, random_state=seed, n_init=1).fit(merge.weights[rest])
    weights = np.concatenate([merge.weights[kept], kmeans.cluster_centers_]).astype(np.float64)
    return weights, {"kept_alone": int(np.sum(sizes == 1)), "reduced_to": int(room),
                     "unverified": int(room), "groups_reduced": int(len(grouped) - len(kept)),
                     "width": int(len(weights))}
