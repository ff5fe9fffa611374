"""A site's convex problem solved exactly: softmax regression by preconditioned L-BFGS.

The problem is the mean cross-entropy of the softmax-linear layer ``W`` (``(C, d + 1)``,
bias last) on the rows ``x~ = [x, 1]`` plus ``l2 / 2 ||W||_F^2``: smooth and, with
``l2 > 0``, strongly convex, so it has one optimum, which the Gram spaces assume
(DESIGN.md 3e). It is solved full batch, from ``W = 0`` (no seed enters), to a stated
gradient tolerance.

Why preconditioned: pixel-like inputs are strongly correlated, and plain L-BFGS needs
hundreds of iterations on them. Böhning's bound ``H <= 1/2 (I - 11^T / C) (x) G``
(``G = mean x~ x~^T``, the node's own Gram matrix) gives a fixed matrix ``M = 1/2 (I -
11^T / C) (x) G + l2 I`` above the Hessian everywhere; ``M^{-1}`` is applied from one
Cholesky factor of ``G / 2 + l2 I`` (the class-mean direction sees ``l2`` alone), and it
is L-BFGS's starting inverse Hessian. A unit step along ``-M^{-1} g`` never raises the
objective (the bound makes it a majorize-minimize step), so the line search rarely
backtracks; L-BFGS's curvature pairs then take the longer steps the bound is too cautious
for where the model is confident.

Public boundary: numpy in and out; torch float64 inside.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DEFAULT_L2", "DEFAULT_TOLERANCE", "SolveReport", "solve_softmax"]

#: the L2 penalty (mean cross-entropy units) a site's exact solve adds: chosen on the
#: sites' validation rows (results/benchmarks/exact_solve.json)
DEFAULT_L2 = 1e-3
#: the solve stops when no entry of the objective's gradient exceeds this
DEFAULT_TOLERANCE = 1e-4
MAX_ITERATIONS = 1000
MEMORY = 10  # L-BFGS curvature pairs kept
_ARMIJO = 1e-4


@dataclass
class SolveReport:
    """What the exact solve did: iterations (gradient evaluations), the largest entry of
    the final gradient, the final objective, and why it stopped (``tolerance`` or
    ``max-iterations``)."""

    iterations: int
    gradient_norm: float
    objective: float
    stopped_by: str
    l2: float
    tolerance: float

    def to_metrics(self) -> dict[str, float]:
        """The report as a reply's metrics."""
        return {"solve-iterations": float(self.iterations),
                "solve-gradient-norm": float(self.gradient_norm),
                "solve-l2": float(self.l2)}


def _objective(xa: torch.Tensor, y: torch.Tensor, w: torch.Tensor, l2: float,
               ) -> tuple[float, torch.Tensor]:
    """The objective at ``w`` and its gradient (float64). The two products with the rows
    run in float32 (three times faster; their rounding, about 1e-6 of the gradient, lies
    far below the tolerance); everything else in float64."""
    n = len(y)
    log_p = torch.log_softmax((xa @ w.to(xa.dtype).T).double(), dim=1)
    loss = -float(log_p.gather(1, y[:, None]).sum()) / n
    residual = log_p.exp_()
    residual[torch.arange(n), y] -= 1.0
    grad = (residual.to(xa.dtype).T @ xa).double() / n
    grad += l2 * w
    return loss + 0.5 * l2 * float((w * w).sum()), grad


class _BohningInverse:
    """``M^{-1}`` of the module docstring: ``(G / 2 + l2 I)^{-1}`` formed once from its
    Cholesky factor, so that each application is one product (two triangular solves per
    application cost as much as the rows' products on a small site)."""

    def __init__(self, gram: torch.Tensor, l2: float) -> None:
        if l2 <= 0:
            raise ValueError(f"l2={l2}: the exact solve needs a positive L2 penalty (the "
                             "class-mean direction and separable data have no optimum without it)")
        system = 0.5 * gram + l2 * torch.eye(gram.shape[0], dtype=torch.float64)
        factor, info = torch.linalg.cholesky_ex(system)
        if int(info):
            raise ValueError("the Gram matrix is not positive semi-definite: check the inputs")
        self.inverse = torch.cholesky_inverse(factor)
        self.l2 = l2

    def __call__(self, g: torch.Tensor) -> torch.Tensor:
        mean = g.mean(dim=0, keepdim=True)
        return (g - mean) @ self.inverse + mean / self.l2


def solve_softmax(x: np.ndarray, y: np.ndarray, num_classes: int, *, l2: float | None = None,
                  tolerance: float | None = None, max_iterations: int = MAX_ITERATIONS,
                  gram: np.ndarray | None = None) -> tuple[np.ndarray, SolveReport]:
    """Minimise mean cross-entropy ``+ l2 / 2 ||W||^2`` of the softmax-linear layer on
    ``(x, y)``; returns ``(W (C, d + 1) float64, report)``.

    ``l2`` and ``tolerance`` default to :data:`DEFAULT_L2` and :data:`DEFAULT_TOLERANCE`.
    ``gram``: the rows' ``mean x~ x~^T`` where the caller holds it already (a node builds
    it for its space); computed here otherwise. Deterministic: the same rows give the same
    ``W`` bit for bit (on the same machine and thread count).
    """
    l2 = DEFAULT_L2 if l2 is None else float(l2)
    tolerance = DEFAULT_TOLERANCE if tolerance is None else float(tolerance)
    xa, yt = _checked_rows(x, y, num_classes)
    n, d = xa.shape[0], xa.shape[1] - 1
    g_mat = (xa.double().T @ xa.double() / n if gram is None
             else torch.as_tensor(gram, dtype=torch.float64))
    if g_mat.shape != (d + 1, d + 1):
        raise ValueError(f"gram has shape {tuple(g_mat.shape)}; the rows need {(d + 1, d + 1)}")
    precondition = _BohningInverse(g_mat, float(l2))
    w = torch.zeros(num_classes, d + 1, dtype=torch.float64)
    loss, grad = _objective(xa, yt, w, l2)
    # (s, y, s.y, y.M^{-1}y): the last term scales the starting matrix (computed once a pair)
    pairs: list[tuple[torch.Tensor, torch.Tensor, float, float]] = []
    iterations, stopped_by = 1, "max-iterations"
    while True:
        if float(grad.abs().max()) <= tolerance:
            stopped_by = "tolerance"
            break
        if iterations >= max_iterations:
            break
        direction = -_two_loop(grad, pairs, precondition)
        slope = float((grad * direction).sum())
        if slope >= 0:  # lost descent (rounding near the optimum): restart from M^{-1}
            pairs.clear()
            direction = -precondition(grad)
            slope = float((grad * direction).sum())
        step, trial, new_loss, new_grad, evaluations = _backtrack(
            xa, yt, w, direction, loss, slope, l2)
        iterations += evaluations
        _remember(pairs, trial - w, new_grad - grad, precondition)
        if new_loss >= loss and step < 1e-10:  # no progress possible in float64
            w, loss, grad = trial, new_loss, new_grad
            stopped_by = "no-progress"
            break
        w, loss, grad = trial, new_loss, new_grad
    return w.numpy(), SolveReport(iterations=iterations, gradient_norm=float(grad.abs().max()),
                                  objective=loss, stopped_by=stopped_by, l2=float(l2),
                                  tolerance=float(tolerance))


def _checked_rows(x: np.ndarray, y: np.ndarray, num_classes: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows with the bias input appended (float32) and the labels, checked."""
    xt = torch.as_tensor(np.asarray(x), dtype=torch.float32)
    if xt.ndim != 2:
        raise ValueError(f"x must be 2-D (rows x features); got shape {tuple(xt.shape)}")
    if not bool(np.isfinite(xt.numpy()).all()):  # torch.isfinite is far slower on the CPU
        raise ValueError("x contains NaN or infinite entries; clean or drop those rows")
    n = xt.shape[0]
    if n == 0:
        raise ValueError("cannot solve on an empty set: the site has no training rows")
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long)
    if yt.shape != (n,):
        raise ValueError(f"y has shape {tuple(yt.shape)}; x has {n} rows")
    if int(yt.min()) < 0 or int(yt.max()) >= num_classes:
        raise ValueError(f"labels must lie in 0..{num_classes - 1}; got {int(yt.min())}.."
                         f"{int(yt.max())}")
    return torch.cat([xt, torch.ones(n, 1, dtype=xt.dtype)], dim=1), yt


def _backtrack(xa: torch.Tensor, yt: torch.Tensor, w: torch.Tensor, direction: torch.Tensor,
               loss: float, slope: float, l2: float):
    """Armijo backtracking from a unit step: ``(step, point, loss, gradient, evaluations)``."""
    step, evaluations = 1.0, 0
    while True:
        trial = w + step * direction
        new_loss, new_grad = _objective(xa, yt, trial, l2)
        evaluations += 1
        if new_loss <= loss + _ARMIJO * step * slope or step < 1e-10:
            return step, trial, new_loss, new_grad, evaluations
        step *= 0.5


def _remember(pairs: list, s: torch.Tensor, yv: torch.Tensor,
              precondition: _BohningInverse) -> None:
    """Keep the curvature pair ``(s, y)`` where it is positive, at most :data:`MEMORY`."""
    sy = float((s * yv).sum())
    if sy > 1e-12 * float((yv * yv).sum()) ** 0.5 * float((s * s).sum()) ** 0.5:
        pairs.append((s, yv, sy, float((yv * precondition(yv)).sum())))
        if len(pairs) > MEMORY:
            pairs.pop(0)


def _two_loop(grad: torch.Tensor, pairs: list, precondition: _BohningInverse) -> torch.Tensor:
    """L-BFGS's inverse-Hessian product with ``M^{-1}``, scaled by the newest pair's
    curvature, as the starting matrix."""
    q = grad.clone()
    alphas = []
    for s, yv, sy, _ in reversed(pairs):
        a = float((s * q).sum()) / sy
        alphas.append(a)
        q -= a * yv
    r = precondition(q)
    if pairs:
        _, _, sy, ymy = pairs[-1]
        r *= sy / ymy
    for (s, yv, sy, _), a in zip(pairs, reversed(alphas)):
        b = float((yv * r).sum()) / sy
        r += (a - b) * s
    return r
