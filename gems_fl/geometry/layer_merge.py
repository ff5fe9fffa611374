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
from threadpoolctl import threadpool_limits

from gems_fl.geometry.checks import check_scalar
from gems_fl.geometry.greedy_merge import METHODS, GreedyMerge, MergeCounts, MergeOptions

__all__ = ["METHODS", "LayerMerge", "MergeCounts", "MergeOptions", "bound_width", "merge_layer"]

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
    from sklearn.cluster import KMeans  # here: scikit-learn's import costs every process 1-3 s
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        # Fewer distinct neurons than clusters: some clusters end up empty, which the
        # result reports (num_nonempty_clusters); not worth a warning.
        warnings.filterwarnings(
            "ignore", message="Number of distinct clusters", category=ConvergenceWarning
        )
        km = KMeans(n_clusters=m, random_state=seed, n_init=n_init).fit(c)
    return km.labels_.astype(np.int64)


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
    max_iter, n_init, shrink, polish_max_iter, threads, method
        The merge's tuning options: see :class:`~gems_fl.geometry.greedy_merge.MergeOptions`.

    Returns the :class:`LayerMerge`, ``weights`` of shape ``(H', d)`` with
    ``num_nonempty_clusters <= H' <= N``. ValueError: empty input, non-2-D centers, radii
    of the wrong shape, mismatched ``d`` across nodes, negative or non-finite radii,
    non-finite centers, no neurons at all, or an option out of range; TypeError: not a
    sequence of pairs, or an option not of its type.
    """
    num_clusters = check_scalar(num_clusters, "num_clusters (m_eps)", int, low=1)
    seed = check_scalar(seed, "seed", int)
    options = MergeOptions(max_iter, n_init, shrink, polish_max_iter, threads, method)
    c, r, node, neuron = _validate(node_neurons)
    m = min(num_clusters, c.shape[0])
    greedy = GreedyMerge(c, r, node, options)
    built, labels, seconds = _cluster_and_merge(c, m, seed, options, greedy)
    return _layer_merge(built, labels, node, neuron, c.shape, num_clusters, m, seconds, greedy)


def _cluster_and_merge(c: np.ndarray, m: int, seed: int, options: MergeOptions,
                       greedy: GreedyMerge) -> tuple[list, np.ndarray, dict[str, float]]:
    """k-means of the neurons into ``m`` clusters (``options.threads`` BLAS/OpenMP
    threads), then the greedy pass in each: ``(groups built, labels, seconds)``."""
    # The greedy pass runs single-threaded: its products are tiny, and on a shared
    # machine waiting BLAS threads made them ~20x slower (measured).
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
    return built, labels, seconds


def _layer_merge(built: list, labels: np.ndarray, node: np.ndarray, neuron: np.ndarray,
                 shape: tuple[int, int], num_clusters: int, m: int, seconds: dict,
                 greedy: GreedyMerge) -> LayerMerge:
    """The :class:`LayerMerge` of the groups ``built`` (``(members, point, cluster)``),
    output neurons ordered by their seed (the group's smallest (node, neuron) pair)."""
    built.sort(key=lambda t: t[0][0])
    groups = [[(int(node[i]), int(neuron[i])) for i in g] for g, _, _ in built]
    sizes = [len(g) for g in groups]
    visited = int(np.unique(labels).size)
    return LayerMerge(
        weights=(
            np.stack([p for _, p, _ in built]) if built else np.empty((0, shape[1]))
        ),
        groups=groups,
        group_clusters=[lab for _, _, lab in built],
        num_intersected_groups=sum(1 for s in sizes if s >= 2),
        num_kept_alone=sum(1 for s in sizes if s == 1),
        clusters_visited=visited,
        num_nonempty_clusters=visited,
        num_clusters=num_clusters,
        num_clusters_used=m,
        num_inputs=shape[0],
        seconds=seconds,
        **asdict(greedy.counts),
    )


def bound_width(merge: LayerMerge, max_width: int, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The merged layer cut to at most ``max_width`` neurons, and what was done.

    Verified groups (two or more neurons with a common point) stay as they are, the
    largest first while they fit in ``max_width - 1``. The rest (the neurons kept alone
    and any group that did not fit) are clustered by k-means into as many clusters as the
    width left allows (at least one), and each cluster is represented by its member
    nearest the cluster's center (a medoid), not by the center itself: every output
    neuron is then a merged neuron or a node's own neuron, so it lies in at least one
    node's neuron space (``unverified`` stays 0). The neurons of the other members have
    no output neuron in their balls; the report counts them (``dropped``).
    """
    check_scalar(max_width, "max_width", int, low=1)
    sizes = np.array([len(g) for g in merge.groups])
    if len(sizes) <= max_width:
        return merge.weights, {"kept_alone": int(np.sum(sizes == 1)),
                               "reduced_to": int(np.sum(sizes == 1)), "unverified": 0,
                               "groups_reduced": 0, "dropped": 0, "width": int(len(sizes))}
    grouped = np.flatnonzero(sizes > 1)
    largest_first = grouped[np.argsort(-sizes[grouped], kind="stable")]
    kept = np.sort(largest_first[: max_width - 1])  # merge order among the kept rows
    rest = np.setdiff1d(np.arange(len(sizes)), kept)
    room = max_width - len(kept)
    rows = merge.weights[rest]
    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters=room, random_state=seed, n_init=1).fit(rows)
    labels = kmeans.labels_
    gap = np.linalg.norm(rows - kmeans.cluster_centers_[labels], axis=1)
    order = np.lexsort((gap, labels))  # by cluster, nearest to its center first
    first = order[np.r_[True, labels[order][1:] != labels[order][:-1]]]
    medoids = rest[np.sort(first)]
    chosen = np.sort(np.concatenate([kept, medoids]))  # merge order among all kept rows
    weights = merge.weights[chosen].astype(np.float64)
    dropped = int(sizes[rest].sum() - sizes[medoids].sum())
    return weights, {"kept_alone": int(np.sum(sizes == 1)), "reduced_to": int(len(medoids)),
                     "unverified": 0, "groups_reduced": int(len(grouped) - len(kept)),
                     "dropped": dropped, "width": int(len(weights))}

