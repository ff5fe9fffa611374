"""Small float64 tensor helpers the geometry shares: input checks, ``augment``, solves.

Public boundary of the geometry: numpy or torch in, float64 torch inside. ``augment``
is the one place that appends the bias column ``[x, 1]``.
"""

from __future__ import annotations

import numpy as np
import torch

#: Eigenvalues of a Gram matrix at or below ``EIGEN_FLOOR * (largest eigenvalue)`` are
#: treated as zero: float64 rounding in ``G`` is about 1e-16 * n relative, so 1e-10
#: leaves six orders of magnitude of head room while keeping every direction the data
#: actually spans.
EIGEN_FLOOR = 1e-10


def augment(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[x, 1]`` as float64 torch, shape ``(N, d + 1)``: inputs for the augmented
    ``[weight | bias]`` matrix ``(C, d + 1)``. ``x`` is ``(N, d)``, finite."""
    xt = layer_matrix("x", x)
    return torch.cat([xt, torch.ones(len(xt), 1, dtype=torch.float64)], dim=1)


def symmetrize_(a, block: int = 512):
    """``a <- (a + a^T) / 2`` in place, a square block at a time, for a numpy array or a
    torch tensor; returns ``a``. Each entry is the same float as ``0.5 * (a + a.T)``'s
    (one sum, one exact halving), without that expression's two temporaries of ``a``'s
    size: 145 MB each at the kernel model's D = 4,252, two per solve of the server's
    pooled system."""
    n = a.shape[0]
    for i in range(0, n, block):
        for j in range(i, n, block):
            part = 0.5 * (a[i:i + block, j:j + block] + a[j:j + block, i:i + block].T)
            a[i:i + block, j:j + block] = part
            a[j:j + block, i:i + block] = part.T
    return a


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite. On the CPU through numpy's view of it:
    ``torch.isfinite(t).all()`` runs at a fraction of memory speed (0.85 s on a node's
    10,000 x 3,774 float64 kernel rows against 0.01 s), and the geometry checks each
    layer matrix it is handed."""
    if t.device.type == "cpu" and not t.requires_grad:
        return bool(np.isfinite(t.numpy()).all())
    return bool(torch.isfinite(t).all())


def layer_matrix(name: str, a, *, finite: bool = True, dtype: torch.dtype = torch.float64
                 ) -> torch.Tensor:
    """A 2-D float64 (or ``dtype``) tensor, with a clear error for the wrong rank or
    non-finite entries."""
    try:
        t = torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a,
                            dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric 2-D array: {exc}") from exc
    if t.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got shape {tuple(t.shape)}")
    if finite and not all_finite(t):
        raise ValueError(f"{name} contains NaN or infinite entries; clean or drop those rows")
    return t


def square_matrix(name: str, a, n: int | None = None, *, finite: bool = True) -> torch.Tensor:
    t = layer_matrix(name, a, finite=finite)
    if t.shape[0] != t.shape[1] or (n is not None and t.shape[0] != n):
        want = f"({n}, {n})" if n is not None else "square (n, n)"
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; expected {want} = (features + 1) x "
            f"(features + 1), the mean of [x, 1] [x, 1]^T"
        )
    return t


def metric_for(name: str, g, n: int, whitened: bool) -> torch.Tensor | None:
    """A metric ``G`` checked to be ``(n, n)``, as a float64 tensor; a metric kept as its
    factor (:class:`~gems_fl.geometry.gram.FactoredGram`), where a whitening of it is
    given (``whitened``), has only its shape checked (None returned) and is never formed."""
    if not whitened or isinstance(g, (np.ndarray, torch.Tensor)):
        return square_matrix(name, g, n)
    shape = tuple(getattr(g, "shape", ()))
    if shape != (n, n):
        raise ValueError(f"{name} has shape {shape}; expected ({n}, {n}) = (features + 1) x "
                         "(features + 1)")
    return None


def center_for(name: str, center, n: int) -> torch.Tensor:
    w = layer_matrix(name, center)
    if w.shape[1] != n:
        raise ValueError(
            f"{name} has shape {tuple(w.shape)}; expected (classes, features + 1) = "
            f"(C, {n}) to match the inputs/Gram matrix"
        )
    return w


def label_indices(y, num: int, classes: int) -> torch.Tensor:
    yt = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    if yt.ndim != 1 or len(yt) != num:
        raise ValueError(f"y must be 1-D with one label per input row ({num}); "
                         f"got shape {tuple(yt.shape)}")
    if yt.is_floating_point():
        if not bool((yt == yt.round()).all()):
            raise ValueError("y must hold integer class labels")
    yt = yt.to(torch.long)
    if num and (int(yt.min()) < 0 or int(yt.max()) >= classes):
        raise ValueError(f"labels must lie in [0, {classes}) for a model with {classes} "
                         f"classes; got range [{int(yt.min())}, {int(yt.max())}]")
    return yt


def range_basis(g: torch.Tensor, floor: float,
                eigen: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of ``g`` above ``floor * (largest eigenvalue)``: ``(lam (m,), V (n, m))``.
    ``eigen``: ``torch.linalg.eigh(g)`` where the caller has it already."""
    lam, vec = torch.linalg.eigh(g) if eigen is None else eigen
    top = float(lam[-1])
    if not top > 0.0:
        raise ValueError("the Gram matrix has no positive eigenvalue (it is zero or "
                         "negative definite); compute it from at least one input row")
    keep = lam > floor * top
    return lam[keep], vec[:, keep]


def solve_right(a: torch.Tensor, b: torch.Tensor, floor: float = EIGEN_FLOOR) -> torch.Tensor:
    """``X`` with ``X A = B`` for symmetric PSD ``A`` (so ``A X^T = B^T``).

    Cholesky when ``A`` is numerically positive definite; otherwise the minimum-norm
    solution restricted to ``A``'s range (eigenvalues above ``floor * max``), which is the
    ``ridge -> 0+`` limit of ``(A + ridge I)``.
    """
    solved = cholesky_solve_right(a, b, floor)
    return solved if solved is not None else spectral_solve_right(torch.linalg.eigh(a), b,
                                                                   0.0, floor)


def cholesky_solve_right(a: torch.Tensor, b: torch.Tensor, floor: float = EIGEN_FLOOR, *,
                         overwrite: bool = False) -> torch.Tensor | None:
    """:func:`solve_right` by Cholesky where ``A`` is numerically positive definite (every
    pivot above ``floor`` times its largest diagonal entry); None otherwise.

    ``overwrite``: ``a`` is the caller's exactly symmetric, contiguous copy, factored in
    its own memory and lost whatever the outcome (the same numbers, without the factor's
    145 MB at the kernel model's D = 4,252). The two triangular solves give
    ``torch.cholesky_solve``'s numbers without the copy of the factor that it makes."""
    top = float(torch.diagonal(a).max())
    if overwrite and a.is_contiguous():
        # a's column-major view: the same matrix (a is symmetric), factored in place
        info = torch.zeros((), dtype=torch.int32)
        chol, info = torch.linalg.cholesky_ex(a.mT, out=(a.mT, info))
    else:
        chol, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        piv = torch.diagonal(chol) ** 2
        if float(piv.min()) > floor * top:
            half = torch.linalg.solve_triangular(chol, b.T.contiguous(), upper=False)
            return torch.linalg.solve_triangular(chol.mT, half, upper=True).T
    return None


def spectral_solve_right(eigen: tuple[torch.Tensor, torch.Tensor], b: torch.Tensor,
                         shift: float = 0.0, floor: float = EIGEN_FLOOR) -> torch.Tensor:
    """:func:`solve_right`'s minimum-norm solution for ``A + shift I`` from ``eigen``, the
    ``torch.linalg.eigh`` of ``A``: one decomposition serves every ``shift`` (the LDA
    point's shrinkage grid)."""
    lam, vec = eigen
    lam = lam + float(shift)
    keep = lam > floor * max(float(lam[-1]), 0.0)
    if not bool(keep.any()):
        raise ValueError("the weighted sum of Gram matrices is zero: no node contributes "
                         "any input; check the Gram matrices and weights")
    vk = vec[:, keep]
    return ((b @ vk) / lam[keep]) @ vk.T
