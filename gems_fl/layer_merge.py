"""Server-side aggregation of one hidden layer from per-neuron good-enough balls.

Paper, section 3.2, step (3): every node ``k`` sends, for each neuron ``i`` of hidden
layer ``j``, a ball ``H^k_{j,i}`` over that neuron's ``[incoming weights; bias]``. The
server builds the aggregate layer so that every node's every neuron ball contains some
output neuron, by greedily intersecting tuples of the cartesian product
``H^1_{j,.} x ... x H^K_{j,.}`` (one neuron per node); neurons that intersect nothing are
kept as they are. To avoid the exponential product, the paper clusters all neurons of
all nodes with k-means into ``m_eps`` clusters and only intersects within a cluster.

What this module does, precisely (:func:`merge_layer`):

1. Stack the neurons of all nodes in node-major order (node 0's neurons 0..H_0-1, then
   node 1's, ...) and run scikit-learn ``KMeans(n_clusters=min(m_eps, N),
   random_state=seed, n_init=n_init)`` on the rows (the ball centers).
2. Visit **every** non-empty cluster, in increasing label order (the authors' code
   skipped label 0).
3. Within a cluster, build groups greedily. Neurons are taken in (node, neuron) order;
   the first unassigned one seeds a group. Then, for each *other* node in increasing
   index order, that node's unassigned neurons of the cluster are tried as candidates,
   nearest (to the group's current common point) first; the first candidate for which a
   common point is *verified* joins and the next node is considered. A group therefore
   holds at most one neuron per node, as a tuple of the paper's cartesian product does.
   A candidate joins only if:

   - the cheap necessary pre-check passes: its ball overlaps each ball of the group
     pairwise (``||c_a - c_b|| <= r_a + r_b``, evaluated with a rounding slack that
     only ever lets more candidates through); and
   - a common point of all the group's balls and the candidate's is verified with
     :meth:`Space.contains`: either the group's current common point already lies in
     the candidate's ball (no solve needed), or :func:`find_intersection` on the group
     plus the candidate returns ``found=True`` (its point is verified by
     ``Space.contains`` inside every ball). Pairwise overlap alone is never accepted:
     three balls can overlap pairwise and have no common point.
4. A group of two or more neurons becomes one output neuron: the point
   :func:`find_intersection` returns for the whole group (the point of the shrunk
   intersection nearest to the mean of the group's centers, verified), or, should that
   final solve not verify, the last verified common point of the incremental build. A
   group of one (the neuron intersected nothing it was tried against) is kept as that
   neuron's center, bit for bit.
5. Output neurons are ordered by their group's first member (node, neuron), which is
   the group's seed. With no merges at all the layer is the nodes' neurons
   concatenated in node order.

Guarantees (all deterministic for a given input and ``seed``):

- every input neuron's ball contains the output neuron of its group (the paper's
  condition ``for all i, k there is i' with f_G,i' in H^k_{j,i}``);
- ``width >= number of non-empty clusters`` (each cluster yields at least one output
  neuron), and more precisely ``width >= sum over clusters of max_k n_{c,k}``, with
  ``n_{c,k}`` the number of node ``k``'s neurons in cluster ``c``, because a group holds
  at most one neuron per node; this bound is attained when every ball contains every
  center of its cluster (very large eps). ``width <= N`` (attained with radius 0 and
  distinct centers);
- *not* guaranteed: that larger radii (larger ``eps``) never widen the layer. They
  usually narrow it, but the greedy first-fit can make an early choice that a larger
  ball enables and that blocks a better grouping (see the tests for a constructed
  case). ``m_eps`` changes the clustering itself, so the width is not monotone in it
  either; it only bounds the width from below through the non-empty clusters.

Cost: k-means is ``O(N m d)`` per Lloyd iteration plus the k-means++ seeding. The greedy
pass computes each cluster's pairwise distance matrix once (``O(n_c^2 d)`` via a Gram
product) and calls :func:`find_intersection` only for candidates that pass the
pre-check and do not already contain the current common point.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

from gems_fl.intersect import find_intersection
from gems_fl.spaces import Space

# Relative slack of the pairwise pre-check on squared distances: the Gram-based
# ``||a||^2 + ||b||^2 - 2 a.b`` has rounding error of order 1e-16 * (||a||^2 + ||b||^2)
# per term; this margin is far above it, and being generous only costs a solve.
_PRECHECK_RTOL = 1e-8


@dataclass
class LayerMerge:
    """The aggregated hidden layer and how it was built.

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
        Clusters the greedy pass processed; equals ``num_nonempty_clusters``.
    num_nonempty_clusters : int
        Distinct k-means labels among the neurons.
    num_clusters : int
        ``m_eps`` as requested.
    num_clusters_used : int
        ``min(num_clusters, N)``, the ``n_clusters`` given to k-means.
    num_inputs : int
        Total input neurons ``N`` over all nodes.
    intersection_calls : int
        Calls to :func:`find_intersection` (candidate tests plus final group solves).
    precheck_rejections : int
        Candidates discarded by the pairwise pre-check without a solve.
    contains_accepts : int
        Candidates accepted because their ball already contained the group's point.
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
    intersection_calls: int = 0
    precheck_rejections: int = 0
    contains_accepts: int = 0

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
            "intersection_calls": int(self.intersection_calls),
            "precheck_rejections": int(self.precheck_rejections),
            "contains_accepts": int(self.contains_accepts),
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
    centers_all, radii_all, nodes, idx = [], [], [], []
    d = None
    for k, item in enumerate(node_neurons):
        try:
            centers, radii = item
        except (TypeError, ValueError):
            raise TypeError(
                f"node_neurons[{k}] must be a (centers, radii) pair"
            ) from None
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
        if d is None:
            d = centers.shape[1]
        elif centers.shape[1] != d:
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
        centers_all.append(centers)
        radii_all.append(radii)
        nodes.append(np.full(centers.shape[0], k, dtype=np.int64))
        idx.append(np.arange(centers.shape[0], dtype=np.int64))
    assert d is not None
    if d == 0:
        raise ValueError("neurons have d=0 parameters: expected d = d_in + 1 >= 1")
    c = np.concatenate(centers_all, axis=0)
    if c.shape[0] == 0:
        raise ValueError("no neurons: every node sent an empty layer")
    return c, np.concatenate(radii_all), np.concatenate(nodes), np.concatenate(idx)


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


class _Greedy:
    """State shared across clusters: the stacked neurons and counters."""

    def __init__(
        self,
        c: np.ndarray,
        r: np.ndarray,
        node: np.ndarray,
        max_iter: int,
        shrink: float,
    ) -> None:
        self.c, self.r, self.node = c, r, node
        self.max_iter, self.shrink = max_iter, shrink
        self.sq = np.einsum("ij,ij->i", c, c)
        self._spaces: dict[int, Space] = {}
        self.calls = self.rejections = self.contains_accepts = 0

    def space(self, i: int) -> Space:
        s = self._spaces.get(i)
        if s is None:
            s = self._spaces[i] = Space(self.c[i], float(self.r[i]))
        return s

    def solve(self, members: list[int]) -> np.ndarray | None:
        """A verified common point of the members' balls, or None."""
        self.calls += 1
        res = find_intersection(
            [self.space(i) for i in members],
            max_iter=self.max_iter,
            shrink=self.shrink,
            fallback="mean",
        )
        return res.point if res.found else None

    def cluster(self, members: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
        """Greedy groups of one cluster's members (global indices, sorted)."""
        c, r, node = self.c[members], self.r[members], self.node[members]
        n = len(members)
        # Pairwise pre-check ||c_a - c_b|| <= r_a + r_b on squared distances from a
        # Gram product, with a slack that can only let extra candidates through.
        sq = self.sq[members]
        d2 = sq[:, None] + sq[None, :] - 2.0 * (c @ c.T)
        rr = r[:, None] + r[None, :]
        slack = _PRECHECK_RTOL * (sq[:, None] + sq[None, :] + rr * rr) + 1e-300
        compatible = d2 <= rr * rr + slack
        assigned = np.zeros(n, dtype=bool)
        nodes_here = np.unique(node)
        out = []
        for s in range(n):
            if assigned[s]:
                continue
            assigned[s] = True
            group = [s]
            point = c[s]
            ok = compatible[s].copy()
            for k in nodes_here:
                if k == node[s]:
                    continue
                cand = np.flatnonzero((node == k) & ~assigned)
                if cand.size == 0:
                    continue
                passing = cand[ok[cand]]
                self.rejections += int(cand.size - passing.size)
                if passing.size == 0:
                    continue
                # Nearest to the current common point first; stable on ties, so the
                # lower neuron index wins.
                dist = np.linalg.norm(c[passing] - point[None, :], axis=1)
                for j in passing[np.argsort(dist, kind="stable")]:
                    gj = int(members[j])
                    if self.space(gj).contains(point):
                        self.contains_accepts += 1
                        new_point = point
                    else:
                        new_point = self.solve([int(members[i]) for i in group] + [gj])
                        if new_point is None:
                            continue
                    group.append(int(j))
                    assigned[j] = True
                    ok &= compatible[j]
                    point = new_point
                    break
            if len(group) >= 2:
                # The canonical point for the whole group: nearest to the mean of its
                # centers (model averaging moved as little as possible). Keep the
                # incremental point, verified too, if this solve does not verify.
                final = self.solve([int(members[i]) for i in group])
                if final is not None:
                    point = final
            out.append(([int(members[i]) for i in group], np.array(point, copy=True)))
        return out


def merge_layer(
    node_neurons: Sequence[tuple[Any, Any]],
    *,
    num_clusters: int,
    seed: int,
    max_iter: int = 2000,
    n_init: int = 1,
    shrink: float = 1e-3,
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
        ``random_state`` of k-means; the result is deterministic for a given seed.
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
        If ``node_neurons`` is not a sequence of pairs.
    """
    if isinstance(num_clusters, bool) or not isinstance(
        num_clusters, (int, np.integer)
    ):
        raise TypeError(f"num_clusters must be an int, got {num_clusters!r}")
    if num_clusters < 1:
        raise ValueError(f"num_clusters (m_eps) must be >= 1, got {num_clusters}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)):
        raise TypeError(f"max_iter must be an int, got {max_iter!r}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if isinstance(n_init, bool) or not isinstance(n_init, (int, np.integer)):
        raise TypeError(f"n_init must be an int, got {n_init!r}")
    if n_init < 1:
        raise ValueError(f"n_init must be >= 1, got {n_init}")
    if not (0.0 <= shrink < 1.0):
        raise ValueError(f"shrink must be in [0, 1), got {shrink!r}")

    c, r, node, neuron = _validate(node_neurons)
    n = c.shape[0]
    m = min(int(num_clusters), n)
    labels = _cluster(c, m, int(seed), int(n_init))

    greedy = _Greedy(c, r, node, int(max_iter), float(shrink))
    built: list[tuple[list[int], np.ndarray, int]] = []
    visited = 0
    # Every label that occurs, 0 included, in increasing order.
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)  # ascending = (node, neuron) order
        visited += 1
        for group, point in greedy.cluster(members):
            built.append((group, point, int(label)))
    # Order output neurons by their seed (the group's smallest (node, neuron) pair).
    built.sort(key=lambda t: t[0][0])

    weights = (
        np.stack([p for _, p, _ in built]) if built else np.empty((0, c.shape[1]))
    )
    groups = [[(int(node[i]), int(neuron[i])) for i in g] for g, _, _ in built]
    sizes = [len(g) for g in groups]
    return LayerMerge(
        weights=weights,
        groups=groups,
        group_clusters=[lab for _, _, lab in built],
        num_intersected_groups=sum(1 for s in sizes if s >= 2),
        num_kept_alone=sum(1 for s in sizes if s == 1),
        clusters_visited=visited,
        num_nonempty_clusters=int(np.unique(labels).size),
        num_clusters=int(num_clusters),
        num_clusters_used=m,
        num_inputs=n,
        intersection_calls=greedy.calls,
        precheck_rejections=greedy.rejections,
        contains_accepts=greedy.contains_accepts,
    )
