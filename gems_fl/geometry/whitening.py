"""Whitening a node's Gram metric: a map ``W`` with ``W^T G W = I`` on the range of ``G``,
applied to rows without forming ``W``, and the part of rows outside that range.

The radius search draws directions uniform on the surface of the node's ellipsoid
(``rows @ W`` are the validation inputs in whitened coordinates) and the certified radius
needs the largest generalised eigenvalue of the validation rows against ``G``: both need
only such a ``W``, not ``G``'s eigenvectors. Any two whitenings differ by a rotation of
the whitened coordinates, under which the search's isotropic draws keep their law.

- :func:`eigen_whitening`: from ``eigh(G)`` (``n^3``); eigenvalues at or below
  ``floor * max`` are ``G``'s null space. For the whole matrix.
- :func:`factor_whitening`: for the factor form a node sends and uses,
  ``G = F F^T + diag(d)`` (``F`` of shape ``(n, r)``, ``d >= 0`` the residual diagonal), in
  ``O(n r^2)``, exactly. The coordinates ``P`` with a residual of their own form a block
  ``A = F_P F_P^T + D_P`` whitened by ``D_P^(-1/2) (I + M M^T)^(-1/2)``,
  ``M = D_P^(-1/2) F_P`` (the inverse square root from ``M``'s thin SVD); the others, ``Q``
  (a residual clamped to zero: the factor holds them whole, or a feature constant on
  the rows), are whitened after the block elimination of ``A``, through the Schur
  complement ``F_Q (I + M^T M)^(-1) F_Q^T`` of rank at most ``r``; ``G``'s null space is
  ``{0} (+)`` the complement of ``F_Q``'s range. A node of few rows at a large width (50
  rows, 4,097 inputs) whitens in a fraction of a second instead of an ``n^3``
  eigendecomposition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gems_fl.geometry.linalg import EIGEN_FLOOR, range_basis


@dataclass(frozen=True)
class Whitening:
    """``apply(rows)``: ``rows @ W``, shape ``(N, dim)``; ``outside(rows)``: the rows'
    coordinates in ``G``'s null space, ``(N, q)`` (None when ``G`` has none)."""

    apply: Callable[[torch.Tensor], torch.Tensor]
    outside: Callable[[torch.Tensor], torch.Tensor] | None
    dim: int


def eigen_whitening(g: torch.Tensor, floor: float = EIGEN_FLOOR,
                    eigen: tuple[torch.Tensor, torch.Tensor] | None = None) -> Whitening:
    """The whitening of the whole matrix ``g`` from its eigenpairs (``eigen``:
    ``torch.linalg.eigh(g)`` where the caller has it already)."""
    lam, vec = torch.linalg.eigh(g) if eigen is None else eigen
    kept, basis = range_basis(g, floor, (lam, vec))
    scaled = basis / kept.sqrt()
    null = vec[:, : len(lam) - len(kept)]  # eigh's ascending order: the dropped come first
    return Whitening(lambda rows: rows @ scaled,
                     (lambda rows: rows @ null) if null.shape[1] else None, len(kept))


def factor_whitening(factor: np.ndarray | torch.Tensor, residual: np.ndarray | torch.Tensor,
                     floor: float = EIGEN_FLOOR) -> Whitening:
    """The whitening of ``G = F F^T + diag(residual)`` in ``O(n r^2)`` (see the module
    docstring): the same range, null space and eigenvalue floor as :func:`eigen_whitening`
    of that matrix, up to a rotation of the whitened coordinates."""
    f = torch.as_tensor(np.asarray(factor), dtype=torch.float64)
    d = torch.as_tensor(np.asarray(residual), dtype=torch.float64).reshape(-1)
    if f.ndim != 2 or len(d) != f.shape[0]:
        raise ValueError(f"factor {tuple(f.shape)} and residual {tuple(d.shape)} do not fit: "
                         "the factor is (n, r) and the residual (n,)")
    if not bool(torch.isfinite(f).all() and torch.isfinite(d).all()) or bool((d < 0).any()):
        raise ValueError("the factor and the residual must be finite, the residual >= 0")
    sing = torch.linalg.svdvals(f)
    top = (float(sing[0]) ** 2 if len(sing) else 0.0) + (float(d.max()) if len(d) else 0.0)
    if not top > 0.0:
        raise ValueError("the Gram matrix has no positive eigenvalue (it is zero); compute it "
                         "from at least one input row")
    tau = floor * top
    p = torch.nonzero(d > tau).reshape(-1)  # coordinates with a residual of their own
    q = torch.nonzero(d <= tau).reshape(-1)  # the others: held by the factor alone, or null
    rank = f.shape[1]
    inv_s = d[p].rsqrt()
    m = f[p] * inv_s[:, None]  # M = D_P^(-1/2) F_P
    u, sv, vt = torch.linalg.svd(m, full_matrices=False)
    shrink = (1.0 + sv * sv).rsqrt() - 1.0  # (I + M M^T)^(-1/2) = I + U diag(shrink) U^T
    v = vt.T
    # K = (I + M^T M)^(-1): the Woodbury form of I - F_P^T A^(-1) F_P, A = G's P block
    k = torch.eye(rank, dtype=torch.float64) - (v * (sv * sv / (1.0 + sv * sv))) @ v.T
    k_half = torch.eye(rank, dtype=torch.float64) + (v * shrink) @ v.T
    # Q block's Schur complement S = F_Q K F_Q^T = (F_Q K^(1/2))(F_Q K^(1/2))^T
    uq, sq, _ = torch.linalg.svd(f[q] @ k_half, full_matrices=False)
    keep = sq * sq > tau
    uq, sq = uq[:, keep], sq[keep]
    f_q = f[q]

    def apply(rows: torch.Tensor) -> torch.Tensor:
        r = rows[:, p] * inv_s
        first = r + ((r @ u) * shrink) @ u.T  # whitens the P block A
        # the Q coordinates less what the P block explains of them: x_Q - x_P A^(-1) F_P F_Q^T
        rest = rows[:, q] - ((r * inv_s) @ f[p] @ k) @ f_q.T
        return torch.cat([first, (rest @ uq) / sq], dim=1)

    def outside(rows: torch.Tensor) -> torch.Tensor:  # G's null space: {0} (+) F_Q's complement
        x = rows[:, q]
        return x - (x @ uq) @ uq.T

    nullity = len(q) - int(keep.sum())
    return Whitening(apply, outside if nullity > 0 else None, len(p) + int(keep.sum()))
