"""Refinement rounds for a softmax-linear model: each node's cross-entropy gradient, and
the server's preconditioned step with the Gram matrices it already holds.

For softmax regression with ``W`` ``(C, n)`` on inputs ``x~`` (bias appended), the
Hessian of the mean cross-entropy is bounded by Bohning's matrix (Bohning 1992):

    H  <=  1/2 (I - 11^T / C)  (x)  mean x~ x~^T  <=  1/2 I (x) G,

with ``G`` the pooled Gram matrix ``sum_k (n_k / N) G_k``. A step ``W <- W - 2 g
(G + ridge I)^-1`` (``g`` the pooled gradient) therefore minimises a quadratic upper
bound of the pooled loss around ``W``: it never increases the pooled loss. Nodes send
only ``g_k`` and their loss (model-sized); the server forms ``g = sum_k (n_k / N) g_k``.
With ``l2 > 0`` the objective is the pooled loss plus ``l2 / 2 ||W||^2`` (the penalty is
the server's: the nodes' replies do not change) and the bound's curvature is
``G + 2 l2 I``.

Bohning's bound is loose where the model is confident (the true curvature ``p (1 - p)``
is far below 1/2), so steps of the bound's length are short. :func:`secant_curvature`
measures how much of the bound the loss shows along the last step (the change of the
pooled gradient against the step, a Barzilai-Borwein quotient in the bound's metric);
``refine-method=secant`` divides the next step by it, and the server checks every point
it steps to with the loss the nodes report there, going back to the last good point with
a plain Bohning step when the loss rose.

Before the first step the selection round (:mod:`gems_fl.geometry.selection`) scales
``W`` by the temperature with the lowest pooled validation cross-entropy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gems_fl.geometry.choices import SECANT_FLOOR
from gems_fl.geometry.linalg import augment, center_for, label_indices, solve_right


def softmax_gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Mean cross-entropy of ``W`` ``(C, d + 1)`` on ``(x (N, d), y (N,))`` and its gradient.

    Returns ``(gradient (C, d + 1), loss)``: ``(P - Y)^T X~ / N`` and
    ``-mean log p_y``, with ``P`` the softmax of ``X~ W^T`` and ``Y`` the one-hot labels.
    """
    xa = augment(x)
    wt = center_for("w", w, xa.shape[1])
    yt = label_indices(y, len(xa), wt.shape[0])
    if len(xa) == 0:
        raise ValueError("a gradient needs at least one training row")
    logits = xa @ wt.T
    logp = torch.log_softmax(logits, dim=1)
    loss = -float(logp.gather(1, yt.view(-1, 1)).mean())
    residual = logp.exp()
    residual[torch.arange(len(yt)), yt] -= 1.0
    return (residual.T @ xa / len(xa)).numpy(), loss


def cross_entropy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of ``W`` ``(C, d + 1)`` on ``(x (N, d), y (N,))``."""
    xa = augment(x)
    wt = center_for("w", w, xa.shape[1])
    yt = label_indices(y, len(xa), wt.shape[0])
    return -float(torch.log_softmax(xa @ wt.T, dim=1).gather(1, yt.view(-1, 1)).mean())


def pooled_gradient(gradients: Sequence[np.ndarray], num_train: Sequence[float]) -> np.ndarray:
    """``sum_k (n_k / N) g_k``: the gradient of the pooled mean loss."""
    n = np.asarray(num_train, dtype=np.float64)
    if len(gradients) == 0 or n.shape != (len(gradients),) or np.any(n <= 0):
        raise ValueError("pass one gradient and one positive row count per node")
    return np.tensordot(n / n.sum(), np.stack([np.asarray(g, np.float64) for g in gradients]), 1)


def bohning_step(w: np.ndarray, gradient: np.ndarray, pooled_gram: np.ndarray,
                 ridge: float = 1e-3, *, l2: float = 0.0) -> np.ndarray:
    """``W - 2 g (G + (ridge + 2 l2) I)^-1``, shape ``(C, d + 1)``: a step that never
    increases the objective (module docstring). ``gradient`` is the gradient of the whole
    objective (:func:`penalised`); ``ridge`` is added to the pooled mean Gram matrix for a
    stable solve. ``refine-method=secant`` sends ``W`` plus this step's displacement divided
    by :func:`secant_curvature`."""
    if l2 < 0:
        raise ValueError(f"l2={l2!r}: pass a penalty >= 0")
    g = torch.as_tensor(np.asarray(pooled_gram), dtype=torch.float64)
    a = 0.5 * (g + g.T)
    a.diagonal().add_(float(ridge) + 2.0 * float(l2))
    step = solve_right(a, torch.as_tensor(np.asarray(gradient), dtype=torch.float64))
    return np.asarray(w, dtype=np.float64) - 2.0 * step.numpy()


def penalised(w: np.ndarray, loss: float, gradient: np.ndarray,
              l2: float) -> tuple[float, np.ndarray]:
    """The pooled loss and gradient plus the penalty ``l2 / 2 ||W||^2``."""
    w = np.asarray(w, dtype=np.float64)
    return (float(loss) + 0.5 * l2 * float(np.sum(w * w)),
            np.asarray(gradient, dtype=np.float64) + l2 * w)


def secant_curvature(step: np.ndarray, gradient_change: np.ndarray, pooled_gram: np.ndarray,
                     l2: float = 0.0, floor: float = SECANT_FLOOR) -> float:
    """The share of Bohning's curvature the objective showed along ``step``, in
    ``[floor, 1]``: ``2 <y, s> / (<s G, s> + 2 l2 <s, s>)`` with ``s`` the step (``(C, d + 1)``)
    and ``y`` the change of the objective's gradient along it. 1 (the plain Bohning step)
    when the step is zero."""
    s = np.asarray(step, dtype=np.float64)
    y = np.asarray(gradient_change, dtype=np.float64)
    if s.shape != y.shape:
        raise ValueError(f"step {s.shape} and gradient change {y.shape} differ in shape")
    bound = float(np.sum((s @ np.asarray(pooled_gram, dtype=np.float64)) * s)) \
        + 2.0 * l2 * float(np.sum(s * s))
    if bound <= 0.0:
        return 1.0
    return float(min(1.0, max(floor, 2.0 * float(np.sum(y * s)) / bound)))
