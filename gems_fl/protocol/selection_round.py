"""The selection round of both strategies: the candidates sent, the nodes' scores checked,
the choice made (the arithmetic is :mod:`gems_fl.geometry.selection`).

The convex strategy runs it after its round of spaces (``pooled-ridge=auto``, or before
refinement steps); the layer-wise strategy after its output round (``pooled-ridge=auto``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from gems_fl.geometry.choices import DEFAULT_REFINE_L2, REFINE_METHODS, RefineMethod, kind_traits
from gems_fl.geometry.gram_merge import gram_result
from gems_fl.geometry.gram_sums import GramSums, summed_result
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.kinds import AggregateOptions
from gems_fl.geometry.points import (
    AUTO,
    POINTS,
    LeadingColumns,
    NodeStatistics,
    SummedStatistics,
    auto_points,
    point_named,
    solve_point,
    solve_points,
)
from gems_fl.geometry.selection import TEMPERATURES, choose_candidate
from gems_fl.geometry.spaces import SummedGramSpace
from gems_fl.geometry.virtual import forget_draw
from gems_fl.learning.threads import compute_threads, concurrent_workers
from gems_fl.protocol.base import NodeReply
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.replies import (
    NotEnoughRepliesError,
    decode_selection_reply,
    validate_replies,
)

# (the point's regularisation: pooled ridge or LDA shrinkage; None for the center, the point)
Candidate = tuple[float | None, IntersectionResult]


def candidate_points(accepted: list[NodeReply], options: AggregateOptions,
                     result: IntersectionResult, ridges: tuple[float, ...], *,
                     sums: GramSums | None = None) -> list[Candidate]:
    """What the selection round scores. ``gram-point=auto``: every registered point the
    statistics allow (:func:`~gems_fl.geometry.points.auto_points`), each at every value of
    its grid (the pooled point: ``ridges``, the run's pooled ridges); a named point: that
    point at each of its values; the closed-form center, or a kind not built from statistics:
    ``result`` alone (only its logit scale is then chosen). ``result`` is reused where it
    is the candidate. ``sums``: the server holds only the sums of the Gram statistics, and
    every candidate is solved from them."""
    if not kind_traits(options.kind).statistics or (options.gram_point != AUTO
                                  and point_named(options.gram_point).regularisation is None):
        return [(None, result)]
    spaces = [r.space for r in accepted]
    counts = [r.metrics["num-train-examples"] for r in accepted]
    stats = (NodeStatistics(spaces, counts) if sums is None
             else SummedStatistics(sums, counts))
    first = point_named(options.gram_point)
    points = [first] if options.gram_point != AUTO else auto_points(stats)
    out: list[Candidate] = []
    for point in points:
        values = point.values(ridges, chosen=options.gram_point != AUTO)
        reused = [point is first and value == options.pooled_ridge for value in values]
        solved = _solve_values(stats, spaces, point.name,
                               [v for v, r in zip(values, reused) if not r], options)
        out += [(value, result if reuse else solved.pop(0))
                for value, reuse in zip(values, reused)]
    if options.linear_columns:  # the kernel model: each point on the rows alone beside
        rows = LeadingColumns(stats, options.linear_columns)
        for point in (points if options.gram_point != AUTO else auto_points(rows)):
            if point.missing(rows) or point.regularisation is None:
                continue
            values = point.values(ridges, chosen=options.gram_point != AUTO)
            out += list(zip(values, _solve_values(rows, spaces, point.name, values, options)))
    forget_draw()  # the gaussian candidates shared one draw of virtual rows
    return out


def _solve_values(stats, spaces: list, name: str, values: Sequence[float | None],
                  options: AggregateOptions) -> list[IntersectionResult]:
    """Point ``name`` at each of ``values``, in order. A point with a call for all its
    values at once takes it (the gaussian points' continuation: one draw, chains of L2s
    each started from the fit at the next larger one). Other values are independent fits
    of the same statistics. Either way the fits run at once on the free cores
    (:func:`~gems_fl.learning.threads.concurrent_workers`), each on one thread: the same
    results as one after another."""
    if point_named(name).solve_many is not None and len(values) > 1:
        with compute_threads():
            return solve_points(stats, spaces, name, values, ridge=options.gram_ridge,
                                seed=options.seed, workers=concurrent_workers(len(values)))
    solve = lambda value: solve_point(stats, spaces, name, value, ridge=options.gram_ridge,
                                      seed=options.seed)
    workers = concurrent_workers(len(values))
    with compute_threads():
        if workers == 1:
            return [solve(value) for value in values]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(solve, values))


@dataclass
class Selected:
    """The selection round's outcome."""

    result: IntersectionResult  # h_G as returned: the candidate, scaled, membership rescored
    ridge: float | None
    scale: float
    val_accuracy: float
    val_losses: dict[str, float]  # the kept candidate's pooled validation loss per scale
    candidates: list[dict[str, Any]]  # every candidate's pooled validation figures
    nodes: list[int]
    rejected: list[dict[str, object]]

    def regularisation(self) -> dict[str, Any]:
        """The kept point and its regularisation, for the round's record."""
        return {"point": self.result.method, **_regularisation(self.result.method, self.ridge)}


_WORDS = {"pooled_ridge": "pooled ridge", "lda_shrinkage": "shrinkage", "gaussian_l2": "L2"}


def _regularisation_name(method: str) -> str:
    """The name of point ``method``'s regularisation (``pooled_ridge`` for the center and
    for spaces of other kinds, whose value is then None)."""
    point = POINTS.get(method)
    return "pooled_ridge" if point is None or point.regularisation is None else point.regularisation


def _regularisation(method: str, value: float | None) -> dict[str, float | None]:
    """A point's regularisation by its name: the pooled ridge, the LDA shrinkage or the
    gaussian fit's L2 penalty."""
    name = _regularisation_name(method)
    return {"pooled_ridge": value} if name == "pooled_ridge" else {"pooled_ridge": None, name: value}


def select(server_round: int, replies: list[Message], sent_to: list[int],
           candidates: list[Candidate], accepted: list[NodeReply], *, scale_always: bool,
           min_replies: int, names: Mapping[int, str], messages: list[Message]) -> Selected:
    """Check the nodes' scores, keep the candidate with the best pooled validation
    accuracy, and scale it by the logit scale with the lowest pooled validation
    cross-entropy when ``scale_always`` or the candidate is the pooled point (the
    closed-form and best points keep their scale, which places them in the spaces)."""
    m = len(candidates)
    decoded, rejected = validate_replies(
        replies, sent_to, lambda content: decode_selection_reply(content, m, len(TEMPERATURES)),
        log_prefix=f"Round {server_round}: ", names=names, messages=messages)
    if len(decoded) < min_replies:
        raise NotEnoughRepliesError(f"selection round: only {len(decoded)} valid replies; "
                                    f"min-replies={min_replies}")
    choice = choose_candidate([v[0] for _, v in decoded], [v[1] for _, v in decoded],
                              [v[2] for _, v in decoded], TEMPERATURES)
    ridge, result = candidates[choice.index]
    rescaled = result.method in POINTS and POINTS[result.method].rescaled
    scale = choice.temperature if scale_always or rescaled else 1.0
    table = [{"point": c.method, **_regularisation(c.method, r),
              **({"columns": c.details["columns"]} if "columns" in c.details else {}),
              "val_accuracy": float(a), "val_loss": float(min(loss))}
             for (r, c), a, loss in zip(candidates, choice.val_accuracy, choice.val_loss)]
    # which family won: the model's whole layer, or (the kernel model) the logistic
    # model's point on the rows' own columns
    family = "linear, on the rows' columns" if "columns" in result.details else "the whole layer"
    details = {**result.details, "selection": {
        "candidates": table, "temperature": choice.temperature, "scale_applied": scale,
        "family": family}}
    result = result_at([r.space for r in accepted], scale * result.point, result.method,
                       details)
    best = choice.val_loss[choice.index]
    log(INFO, "Selection round: %s%s, %slogit scale %g (pooled validation accuracy %.4f, "
        "cross-entropy %.4f; %d nodes); h_G lies in %s of %d spaces", result.method,
        f" on the {result.details['columns']} rows' columns alone (the linear model)"
        if "columns" in result.details else "",
        "" if ridge is None else f"{_WORDS[_regularisation_name(result.method)]} {ridge:g}, ", scale,
        choice.val_accuracy[choice.index], float(np.min(best)), len(decoded),
        "?" if None in result.inside else sum(result.inside), len(result.inside))
    return Selected(result, ridge, scale, float(choice.val_accuracy[choice.index]),
                    dict(zip(map(str, TEMPERATURES), map(float, best))), table,
                    [node_id for node_id, _ in decoded], rejected)


class Refiner:
    """Refinement steps on one linear layer (the convex model, or the MLP's output layer).

    Holds the accepted spaces (their Gram matrices are the curvature), sums the Gram
    matrices of the answering nodes once per node set, checks every gradient reply and
    steps. ``shapes`` are the layer's state-dict shapes; ``start`` the selected ``h_G``.
    The objective is the pooled cross-entropy plus ``l2 / 2 ||W||^2``, ``l2`` relative to
    the mean diagonal of the pooled Gram matrix (:mod:`gems_fl.geometry.refine`).

    ``secant`` (default): the nodes take their gradient at the point sent; a point whose
    objective is not above the last good one is kept, and the next step is Bohning's
    divided by the curvature the objective showed along the last step
    (:func:`~gems_fl.geometry.refine.secant_curvature`); a point where it rose is dropped
    and the next step is the plain Bohning step from the last good point. :attr:`x` is
    always the plain Bohning step from the last good point, which never increases the
    objective, so the model after any step is never worse than the last one checked.
    ``monotone``: ``x <- x - 2 g (G + ridge I)^-1`` from the current model.
    """

    def __init__(self, accepted: list[NodeReply], shapes: dict[str, tuple[int, ...]],
                 ridge: float, min_replies: int, names: Mapping[int, str], *,
                 start: np.ndarray, method: str = "secant",
                 l2: float = DEFAULT_REFINE_L2, sums: GramSums | None = None) -> None:
        if method not in REFINE_METHODS:
            raise ValueError(f"method={method!r} is not one of {', '.join(REFINE_METHODS)}")
        if not l2 >= 0:
            raise ValueError(f"l2={l2!r}: pass a penalty >= 0")
        self.spaces = {r.node_id: r for r in accepted}
        self.sums = sums
        self.shapes = shapes
        self.ridge = ridge
        self.min_replies = min_replies
        self.names = names
        self.method = method
        self.l2_relative = float(l2)
        self.x = np.asarray(start, dtype=np.float64).reshape(-1)
        self._sent: np.ndarray | None = None
        self._pooled: tuple[tuple[int, ...], np.ndarray | None] = ((), None)
        # secant: the last good point, its objective and gradient, the curvature scale
        self._good: tuple[np.ndarray, float, np.ndarray] | None = None
        self._curvature = 1.0
        self.last: dict[str, object] = {}  # what the last step did, for the round's record

    @classmethod
    def for_run(cls, accepted: list[NodeReply], shapes: dict[str, tuple[int, ...]],
                result: IntersectionResult, options: ServerOptions, names: Mapping[int, str],
                start: np.ndarray, sums: GramSums | None = None) -> Refiner:
        """The run's refiner: the ridge of ``result`` (chosen or set), ``refine-method``,
        ``refine-l2`` (as the run plan resolved it)."""
        return cls(accepted, shapes, step_ridge(result, options.aggregate),
                   options.min_replies, names, start=start, method=options.refine_method,
                   l2=options.refine_l2, sums=sums)

    def _l2(self) -> float:
        """The penalty in the units of the pooled Gram matrix of the current node set."""
        gram = self._pooled[1]
        return 0.0 if gram is None else self.l2_relative * float(np.mean(np.diag(gram)))

    def _matrix(self, vector: np.ndarray) -> np.ndarray:
        return vector.reshape(self.shapes["weight"][0], -1)

    def query(self) -> np.ndarray:
        """The model to send for the next step: ``x``, or (secant) the last good point
        moved by ``x``'s plain step divided by the curvature scale."""
        if self.method == RefineMethod.SECANT and self._good is not None:
            good = self._good[0]  # x is the plain Bohning step from it
            self._sent = good + (self.x - good) / self._curvature
        else:
            self._sent = self.x
        return self._sent

    def step(self, step: int, server_round: int, replies: list[Message],
             sent_to: list[int], messages: list[Message]
             ) -> tuple[float, list[int], list[dict[str, object]]]:
        """Step from the model last sent; returns ``(pooled training loss there, nodes
        used, rejected)``. The new model is :attr:`x`; :attr:`last` says what the step did."""
        from gems_fl.geometry.refine import penalised, pooled_gradient

        if self._sent is None:
            raise RuntimeError("query() gives the model to send before a step")
        usable, rejected = self._usable_replies(server_round, replies, sent_to, messages)
        if len(usable) < self.min_replies:
            raise NotEnoughRepliesError(f"refinement step {step}: only {len(usable)} valid "
                                        f"replies; min-replies={self.min_replies}")
        usable.sort(key=lambda u: u[0])  # replies come in any order; the node set does not
        counts = [m["num-train-examples"] for _, _, m in usable]
        nodes = tuple(node_id for node_id, _, _ in usable)
        self._pool(nodes, counts, server_round)
        weights = np.asarray(counts) / np.sum(counts)
        loss = float(np.dot(weights, [m["loss"] for _, _, m in usable]))
        sent = self._matrix(self._sent)
        l2 = self._l2()
        objective, gradient = penalised(sent, loss, pooled_gradient([g for _, g, _ in usable],
                                                                    counts), l2)
        note = self._move(sent, objective, gradient, l2)
        self.last["objective"] = objective
        log(INFO, "Refinement step %d: pooled training loss %.4f at the model sent "
            "(objective with the L2 penalty %.4f), %d nodes%s",
            step, loss, objective, len(usable), note)
        return loss, list(nodes), rejected

    def _usable_replies(self, server_round: int, replies: list[Message], sent_to: list[int],
                        messages: list[Message]) -> tuple[list, list[dict[str, object]]]:
        """The replies that decode and count the rows their node's space was fitted on:
        ``([(node id, gradient, metrics)], rejected)``; the others logged and rejected."""
        from gems_fl.naming import describe_node
        from gems_fl.protocol.replies import decode_gradient_reply, rejection_record

        decoded, rejected = validate_replies(
            replies, sent_to, lambda content: decode_gradient_reply(content, self.shapes),
            log_prefix=f"Round {server_round}: ", names=self.names, messages=messages)
        usable = []
        for node_id, (gradient, metrics) in decoded:
            expected = int(self.spaces[node_id].metrics["num-train-examples"])
            if int(metrics["num-train-examples"]) != expected:
                reason = (f"refinement reply counts {int(metrics['num-train-examples'])} "
                          f"training rows; its space was fitted on {expected}")
                log(WARNING, "Round %d: Rejected reply from node %s: %s", server_round,
                    describe_node(node_id, self.names), reason)
                rejected.append(rejection_record(node_id, self.names, reason))
                continue
            usable.append((node_id, gradient, metrics))
        return usable, rejected

    def _pool(self, nodes: tuple[int, ...], counts: list, server_round: int) -> None:
        """The pooled Gram matrix of ``nodes`` (summed once for a node set; a new set
        restarts the secant's memory, since objectives over other nodes do not compare)."""
        from gems_fl.geometry.pooled import pooled_gram

        if self._pooled[0] == nodes:
            return
        if self.sums is not None:  # the sums of every accepted node
            if len(nodes) != len(self.spaces):
                log(WARNING, "Round %d: %d of %d nodes answered; the curvature stays the "
                    "sum over all accepted nodes (the server holds no single node's Gram "
                    "matrix, server-grams=sums)", server_round, len(nodes), len(self.spaces))
            self._pooled = (nodes, self.sums.pooled_gram())
        else:
            self._pooled = (nodes, pooled_gram([self.spaces[n].space.gram for n in nodes],
                                               counts).numpy())
        self._good = None
        self._curvature = 1.0

    def _move(self, sent: np.ndarray, objective: float, gradient: np.ndarray,
              l2: float) -> str:
        """Set :attr:`x` by Bohning's step (secant: from the last good point, scaled by the
        curvature); what the log line adds about it."""
        from gems_fl.geometry.refine import bohning_step, secant_curvature

        if self.method != RefineMethod.SECANT:
            self.x = bohning_step(sent, gradient, self._pooled[1], self.ridge, l2=l2).reshape(-1)
            self.last = {}
            return ""
        note = ""
        self.last = {"curvature": self._curvature, "kept": True}
        if self._good is None:
            self._good = (self._sent, objective, gradient)
        elif objective <= self._good[1]:
            good, _, good_gradient = self._good
            self._curvature = secant_curvature(sent - self._matrix(good),
                                               gradient - good_gradient,
                                               self._pooled[1], l2)
            self._good = (self._sent, objective, gradient)
        else:
            self.last["kept"] = False
            note = (f"; the objective rose from {self._good[1]:.4f} to {objective:.4f}: "
                    "back to the last good point, plain Bohning step next")
            self._curvature = 1.0
        good, _, good_gradient = self._good
        self.x = bohning_step(
            self._matrix(good), good_gradient, self._pooled[1], self.ridge,
            l2=l2).reshape(-1)
        return note


def result_at(spaces: list, point: np.ndarray, method: str,
              details: dict[str, Any]) -> IntersectionResult:
    """``point`` as ``h_G``, with its membership in every space where the server holds the
    Gram matrices (else left to the nodes: :func:`~gems_fl.geometry.gram_sums.summed_result`)."""
    if isinstance(spaces[0], SummedGramSpace):
        return summed_result(spaces, point, method, details)
    return gram_result(spaces, point, method, details)


def step_ridge(result: IntersectionResult, options: AggregateOptions) -> float:
    """The ridge of Bohning's step: the pooled ridge chosen (or set), else the default."""
    chosen = result.details.get("pooled_ridge")
    return float(chosen) if chosen is not None else options.pooled_ridge
