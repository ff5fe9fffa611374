"""The greedy pass of the layer merge: grow groups of neurons whose balls share a
verified point, within each k-means cluster (steps 3 and 4 of
:func:`gems_fl.geometry.layer_merge.merge_layer`, whose docstring states the rules).

Holds the pass's options (:class:`MergeOptions`) and counters (:class:`MergeCounts`);
the exact ball tests it relies on are in :mod:`gems_fl.geometry.ball_meet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

import numpy as np

from gems_fl.geometry.ball_meet import ball_dual, squared_distances, three_balls_meet
from gems_fl.geometry.checks import check_option, check_scalar
from gems_fl.geometry.intersect import find_intersection
from gems_fl.geometry.spaces import Space, within_radius


class MergeMethod(StrEnum):
    """How a neuron merge tests a candidate: the exact dual test first, or Dykstra for every one (the reference)."""

    DUAL = "dual"
    DYKSTRA = "dykstra"


METHODS = tuple(m.value for m in MergeMethod)


class Joined(Enum):
    """How a group's last member joined it (its point is then from that step)."""

    SEED = "seed"  # the group's first member: its own center
    CONTAINS = "contains"  # the group's point already lay in the member's ball
    DUAL = "dual"  # the dual test's verified common point
    SOLVE = "solve"  # find_intersection's point

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



@dataclass(frozen=True)
class MergeOptions:
    """The tuning options of :func:`~gems_fl.geometry.layer_merge.merge_layer`, validated.

    Attributes
    ----------
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
    """

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


@dataclass
class _Cluster:
    """One cluster's neurons, indexed locally ``0..n-1`` in (node, neuron) order.

    ``members`` are the global indices; ``d2``/``err2`` the squared center distances
    and their rounding bound (:func:`squared_distances`); ``compatible`` the pairwise
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
        d2, err2 = squared_distances(c)
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
        return three_balls_meet(
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

    ``how`` says how the last member joined (:class:`Joined`).
    """

    members: list[int]
    lam: np.ndarray
    point: np.ndarray
    how: Joined


def _node_blocks(node: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """``order`` (ascending local indices) split into runs of one node each."""
    starts = np.flatnonzero(np.r_[True, node[order[1:]] != node[order[:-1]]])
    return np.split(order, starts[1:])


class GreedyMerge:
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
        group = _Group([s], np.ones(1), cl.c[s], Joined.SEED)
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
    ) -> tuple[np.ndarray, np.ndarray, Joined] | None:
        """``(dual weights, verified common point, how)`` of ``group + [j]``, or None.

        In order: the group's point may already be in ``j``'s ball (``CONTAINS``);
        with ``method="dual"``, :meth:`dual_test` may prove the balls disjoint (None)
        or give a verified common point (``DUAL``); otherwise
        :func:`find_intersection` decides (``SOLVE``).
        """
        trial = group.members + [j]
        trial_global = cl.global_indices(trial)
        lam = np.append(group.lam, 0.0)
        if self.verified(trial_global[-1:], group.point):
            self.counts.contains_accepts += 1
            return lam, group.point, Joined.CONTAINS
        if self.options.method == MergeMethod.DUAL:
            verdict, lam, point = self.dual_test(cl, trial, trial_global, lam)
            if verdict == "empty":
                return None
            if verdict == "point":
                return lam, point, Joined.DUAL
        found = self.solve(trial_global, self.options.max_iter)
        return None if found is None else (lam, found, Joined.SOLVE)

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
        verdict, lam, _ = ball_dual(
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
        if group.how is Joined.SOLVE:
            return group.point
        budget = opts.max_iter if opts.method == MergeMethod.DYKSTRA else opts.polish_max_iter
        if budget > 0:
            found = self.solve(members, budget)
            if found is not None:
                return found
        if opts.method == MergeMethod.DUAL and np.all(cl.r2[group.members] > 0):
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
        verdict, lam, _ = ball_dual(
            cl.d2[sub], cl.r2[local], group.lam, float(cl.err2[sub].max()),
            _DUAL_MAX_ITER, optimize=True,
        )
        if verdict == "point":
            w = lam @ cl.c[local]
            if self.verified(members, w):
                self.counts.power_points += 1
                return w
        return None
