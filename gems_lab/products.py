"""The pooled LDA point from rounds of Gram products: model-sized messages, exact in the
limit.

A node's Gram matrix is ``(d + 1)^2 / 2`` numbers, too many for some uplinks at random-
feature widths (8.4 MB as a float32 triangle at D=2,048). The pooled points need the
matrix only through products, so each node can instead answer a sequence of queries:
the server sends a ``(d, C)`` block ``V`` and node ``k`` returns ``(n_k / N) G_k [V; 0]``
(its top ``d`` rows), a message the size of the model. Preconditioned conjugate gradients
on those summed products solve :func:`gems_fl.geometry.pooled.pooled_lda`'s system

    (S_w + s I) X = mu^T,    S_w = A_dd - mu^T diag(pi) mu,   s = shrinkage tr(S_w) / d,

with one product per round; the round before the first needs only the summed label
moments ``B`` (``(C, d + 1)``) and the summed diagonal of ``A`` (the Jacobi
preconditioner and the trace), both model-sized too. After ``d`` rounds CG is exact in
exact arithmetic; the point is how few rounds reach the accuracy of the whole matrix
(``benchmarks/rf_uplink.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from gems_fl.geometry.linalg import layer_matrix
from gems_fl.geometry.pooled import class_priors_and_means, lda_classifier

#: ``product(V)``: the nodes' summed ``sum_k (n_k / N) (G_k [V; 0])[:d]`` for a ``(d, C)``
#: block ``V``, one round of messages.
Product = Callable[[np.ndarray], np.ndarray]


def lda_by_products(product: Product, moments: np.ndarray, diagonal: np.ndarray,
                    rounds: int, shrinkage: float = 1e-2) -> list[np.ndarray]:
    """The pooled LDA classifier ``(C, d + 1)`` after each of ``rounds`` product rounds.

    ``moments``: the pooled label moments ``B = sum_k (n_k / N) M_k`` ``(C, d + 1)``;
    ``diagonal``: the pooled Gram matrix's diagonal ``(d + 1,)``; ``product``: one round
    (see :data:`Product`). Column ``c`` of ``X`` is class ``c``'s own preconditioned CG
    run, all ``C`` advanced by the same product. The ``t``-th point returned is built from
    the ``t``-th iterate exactly as :func:`pooled_lda` builds it from the solve.
    """
    if not (isinstance(rounds, (int, np.integer)) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1; got {rounds!r}")
    if not (math.isfinite(shrinkage) and shrinkage > 0):
        raise ValueError(f"shrinkage must be finite and > 0 (CG needs a positive definite "
                         f"system); got {shrinkage}")
    b = layer_matrix("moments", moments)
    diag = torch.tensor(np.asarray(diagonal, dtype=np.float64)).reshape(-1)
    if len(diag) != b.shape[1]:
        raise ValueError(f"diagonal has {len(diag)} entries; the moments have {b.shape[1]} "
                         "columns (features + 1)")
    d = b.shape[1] - 1
    prior, mu = class_priors_and_means(b)
    within_diag = diag[:d] - (prior[:, None] * mu * mu).sum(dim=0)
    shift = float(shrinkage) * float(within_diag.sum().clamp(min=0.0)) / d
    precondition = 1.0 / (within_diag.clamp(min=0.0) + shift)

    def within_times(v: torch.Tensor) -> torch.Tensor:
        av = torch.as_tensor(np.asarray(product(v.numpy())), dtype=torch.float64)
        if av.shape != v.shape:
            raise ValueError(f"a product round returned shape {tuple(av.shape)}; expected "
                             f"{tuple(v.shape)}")
        return av - mu.T @ (prior[:, None] * (mu @ v)) + shift * v

    rhs = mu.T.clone()  # (d, C)
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    z = precondition[:, None] * r
    p = z.clone()
    rz = (r * z).sum(dim=0)
    points = []
    for _ in range(int(rounds)):
        ap = within_times(p)
        curvature = (p * ap).sum(dim=0)
        step = torch.where(curvature > 0, rz / curvature.clamp(min=1e-300), torch.zeros_like(rz))
        x = x + step * p
        r = r - step * ap
        z = precondition[:, None] * r
        rz_next = (r * z).sum(dim=0)
        p = z + torch.where(rz > 0, rz_next / rz.clamp(min=1e-300), torch.zeros_like(rz)) * p
        rz = rz_next
        points.append(lda_classifier(x.T, prior, mu))
    return points
