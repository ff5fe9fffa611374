"""Logit-space ("Gram") good-enough spaces for a linear softmax layer.

For a linear softmax layer ``W`` of shape ``(C, d + 1)`` (last column = bias) and a
node's inputs ``x~ = [x, 1]``, the node's Gram matrix is

    G_k = mean over the node's training inputs of  x~ x~^T          ((d+1) x (d+1))

and, since ``tr(D G_k D^T) = mean_n ||D x~_n||^2``, the quantity

    ||W - W_k||_{G_k} = sqrt(tr((W - W_k) G_k (W - W_k)^T))

is the root-mean-square (over the node's training inputs) of the L2 norm of the change
of the logit vector. The node's good-enough space is the ellipsoid
``{W : ||W - W_k||_{G_k} <= rho_k}``: every model in it produces, on the node's own
inputs, logits within RMS distance ``rho_k`` of the node's model. Radii therefore live
on the scale of the logits, not of the weights.

Where ``G_k`` is singular (an input feature that never varies, fewer samples than
``d + 1``) the ellipsoid is an unbounded cylinder: moving ``W`` along the null space of
``G_k`` does not change a single logit on the node's training inputs. The sampler and
the radius search therefore work in the range of ``G_k`` (see
``sample_gram_directions``), and the server's closed-form center pins the null-space
components with a ridge term or, with ``ridge=0``, by the minimum-norm solution.

This module holds the statistic itself: the Gram matrix, its wire packing (full upper
triangle or a low-rank factor), the reply check and the distance. The radius search is
in :mod:`gems_fl.geometry.gram_search`, the certified radius in
:mod:`gems_fl.geometry.certify`, the server's point in :mod:`gems_fl.geometry.gram_merge`.

Public boundary: numpy arrays in and out; torch float64 inside.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gems_fl.geometry.linalg import (
    all_finite,
    augment,
    center_for,
    label_indices,
    layer_matrix,
    square_matrix,
)

#: From this size on, a Gram matrix that travels as a factor is built and factored in
#: float32: :func:`float32_gram` (BLAS's rank-k update: 0.9-1.8 s against 3.0-4.2 s in
#: float64 for 10,000 rows of 3,765 inputs, the kernel model's) and :func:`low_rank_factor`'s
#: top ``rank`` eigenpairs alone (randomized subspace iteration: 1.2 s against LAPACK's MRRR's
#: 4.9 s for a 3,766-square matrix at rank 754; the first on one thread, LAPACK on two). The factor travels as
#: float16 (:func:`half_factor`), so float32's rounding (about 1e-7 of the largest entry)
#: lies far below what the wire keeps. Below it (the logistic model's 785) both cost a
#: tenth of a second in float64 and the factors stay as they were.
TOP_EIGEN_MIN_SIZE = 2048
#: power steps of the randomized top eigenpairs (the Frobenius error of rank 754 of the kernel
#: model's matrix: 1.12, 1.03 and 1.01 times the optimum's with 1, 2 and 3 steps)
EIGEN_POWER_STEPS = 2


def gram_matrix(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """``mean_n x~_n x~_n^T`` with ``x~ = [x, 1]``: one ``(d+1) x N @ N x (d+1)`` matmul.

    Returns a symmetric float64 ``(d + 1, d + 1)`` array. Its last diagonal entry is 1
    and its last row holds ``[mean x, 1]``.
    """
    xt = layer_matrix("x", x)
    num, d = xt.shape
    if num == 0:
        raise ValueError("x has no rows: the Gram matrix is a mean over inputs and needs "
                         "at least one")
    # Blocks [[X^T X, X^T 1], [1^T X, N]] / N: the same numbers as Xa^T Xa without
    # copying X into the augmented array first.
    g = torch.empty(d + 1, d + 1, dtype=torch.float64)
    xtx = xt.T @ xt
    g[:d, :d] = 0.5 * (xtx + xtx.T)
    g[:d, d] = g[d, :d] = xt.sum(dim=0)
    g[d, d] = num
    return (g / num).numpy()


def float32_gram(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """:func:`gram_matrix` from float32 products (``X^T X`` by BLAS's symmetric rank-k
    update, the column sums in float64): for a layer that travels as a rank-r factor at
    :data:`TOP_EIGEN_MIN_SIZE` inputs or more. Float64 ``(d + 1, d + 1)``, symmetric."""
    from scipy.linalg.blas import ssyrk

    xt = layer_matrix("x", x, dtype=torch.float32)
    num, d = xt.shape
    if num == 0:
        raise ValueError("x has no rows: the Gram matrix is a mean over inputs and needs "
                         "at least one")
    rows = np.asarray(xt.numpy(), order="C")
    upper = ssyrk(1.0 / num, rows.T, trans=0, lower=0)  # (d, d), upper triangle filled
    g = np.empty((d + 1, d + 1), dtype=np.float64)
    full = upper + upper.T  # the strict lower triangle is zero: the diagonal doubles
    np.fill_diagonal(full, upper.diagonal())
    g[:d, :d] = full
    g[:d, d] = g[d, :d] = rows.sum(axis=0, dtype=np.float64) / num
    g[d, d] = 1.0
    return g


def label_moments(x: np.ndarray | torch.Tensor, y, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``mean_n e_{y_n} x~_n^T`` and the class counts: the node's label moments.

    Returns ``(moments (C, d + 1) float64, counts (C,) int64)``. With one-hot labels
    ``Y`` and ``X~ = [X, 1]`` the moments are ``Y^T X~ / N``; their last column is
    ``counts / N``. Beside the Gram matrix (``X~^T X~ / N``) they give the pooled
    least-squares classifier of all nodes from sums alone (:mod:`gems_fl.geometry.pooled`).
    """
    xt = layer_matrix("x", x)
    num = len(xt)
    if num == 0:
        raise ValueError("x has no rows: label moments are a mean over inputs and need one")
    yt = label_indices(y, num, int(num_classes))
    counts = torch.bincount(yt, minlength=int(num_classes))
    sums = torch.zeros(int(num_classes), xt.shape[1], dtype=torch.float64).index_add_(0, yt, xt)
    moments = torch.cat([sums, counts.to(torch.float64).unsqueeze(1)], dim=1) / num
    return moments.numpy(), counts.numpy().astype(np.int64)


def class_grams(x: np.ndarray | torch.Tensor, y, num_classes: int) -> np.ndarray:
    """``mean over the rows of class c of x~ x~^T`` for every class the node holds.

    Returns float64 ``(m, d + 1, d + 1)``, one matrix per class with a training row, in
    class order (the classes whose count in :func:`label_moments` is > 0). Each has 1 at
    its bias entry and ``[mean of class c, 1]`` in its last row; the count-weighted sum of
    them is the node's Gram matrix. With the label moments they give each class's mean
    and covariance, which the ``gaussian`` point needs (:mod:`gems_fl.geometry.virtual`).
    """
    xa, yt = labelled_rows(x, y, num_classes)
    out = []
    for c in torch.unique(yt).tolist():
        rows = xa[yt == c]
        g = rows.T @ rows / len(rows)
        out.append(0.5 * (g + g.T))
    return torch.stack(out).numpy()


def labelled_rows(x: np.ndarray | torch.Tensor, y, num_classes: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x~ = [x, 1] (N, d + 1) float64, labels (N,))``, checked, for class statistics."""
    xt = layer_matrix("x", x)
    num = xt.shape[0]
    if num == 0:
        raise ValueError("x has no rows: class Gram matrices are means over inputs and need one")
    yt = label_indices(y, num, int(num_classes))
    return torch.cat([xt, torch.ones(num, 1, dtype=xt.dtype)], dim=1), yt


def check_class_grams(triangles, counts: np.ndarray, moments: np.ndarray, n: int,
                      *, tol: float = 1e-4) -> np.ndarray:
    """Validate a node's class Gram matrices (packed upper triangles, one row per class
    with a count > 0, in class order) against its checked label moments and counts;
    return them as float64 ``(m, n, n)``.

    Raises ``ValueError`` naming the first problem: a shape other than ``(m, n (n + 1) /
    2)``; a matrix that fails :func:`check_gram` (finite, symmetric, PSD, bias entry 1); a
    last row farther than ``tol`` (relative to the largest entry) from ``[class mean,
    1]``, the class mean the label moments give.
    """
    tri = np.asarray(triangles, dtype=np.float64)
    held = np.flatnonzero(np.asarray(counts) > 0)
    if tri.shape != (len(held), n * (n + 1) // 2):
        raise ValueError(f"class Gram matrices have shape {tri.shape}; expected "
                         f"({len(held)}, {n * (n + 1) // 2}): one packed triangle per class "
                         "with training rows")
    return checked_class_matrices(tri, held, np.asarray(counts)[held], counts, moments, n,
                                  tol=tol)


def checked_class_matrices(triangles: np.ndarray, classes: np.ndarray, rows: np.ndarray,
                           counts: np.ndarray, moments: np.ndarray, n: int, *,
                           tol: float = 1e-4) -> np.ndarray:
    """The matrices ``(m, n, n)`` of packed triangles ``(m, n (n + 1) / 2)``, matrix ``i``
    over ``rows[i]`` rows of class ``classes[i]`` (one per class, or per k-means component
    of a class, :mod:`gems_fl.geometry.components`), each checked by :func:`check_gram`
    (bias entry 1), and each class's row-weighted mean last row within ``tol`` (relative
    to its largest entry) of ``[class mean, 1]`` as the label moments give it."""
    out = np.stack([check_gram(unpack_triangle(t, n), n, unit_bias_tol=1e-4) for t in triangles])
    num_rows = float(np.sum(counts))
    for c in np.unique(classes):
        mine = classes == c
        last = rows[mine] @ out[mine, -1] / counts[c]
        mean = np.append(np.asarray(moments[c, :-1], dtype=np.float64) * num_rows / counts[c], 1.0)
        gap = float(np.abs(last - mean).max())
        if gap > tol * max(1.0, float(np.abs(out[mine]).max())):
            raise ValueError(f"class {int(c)}'s Gram matrix has a last row {gap:.3g} away from "
                             "[class mean, 1] as the label moments give it")
    return out


def check_moments(moments, counts, shape: tuple[int, int], num_rows: int,
                  *, tol: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Validate label moments received from a node; return them as float64 and int64.

    Raises ``ValueError`` naming the first problem: a shape other than ``shape``
    (``(C, d + 1)``) and ``(C,)``; NaN or infinite entries; counts that are not
    non-negative integers summing to ``num_rows`` (the node's training-sample count);
    a bias column (the last) farther than ``tol`` from ``counts / num_rows``.
    """
    m = np.asarray(moments, dtype=np.float64)
    c = np.asarray(counts, dtype=np.float64)
    if m.shape != tuple(shape) or c.shape != (shape[0],):
        raise ValueError(f"label moments have shape {m.shape} and counts {c.shape}; expected "
                         f"{tuple(shape)} and ({shape[0]},) = (classes, features + 1), (classes,)")
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(c))):
        raise ValueError("label moments or counts contain NaN or infinite entries")
    if np.any(c < 0) or np.any(c != np.round(c)) or int(c.sum()) != int(num_rows):
        raise ValueError(f"class counts {c.astype(np.int64).tolist()} must be non-negative "
                         f"integers summing to the node's {num_rows} training samples")
    gap = float(np.abs(m[:, -1] - c / num_rows).max())
    if gap > tol:
        raise ValueError(f"label moments' last column differs from counts / n by {gap:.3g}: "
                         "a mean of e_y [x, 1]^T has the class shares there")
    return m, c.astype(np.int64)


def pack_triangle(g: np.ndarray) -> np.ndarray:
    """Upper triangle (row-major, diagonal included) of a square matrix as float32 1-D.

    ``n (n + 1) / 2`` numbers; ``unpack_triangle`` restores the symmetric matrix.
    """
    t = square_matrix("G", g).numpy()
    return t[np.triu_indices(len(t))].astype(np.float32)


def unpack_triangle(vec: np.ndarray, n: int | None = None) -> np.ndarray:
    """Symmetric float64 ``(n, n)`` matrix from ``pack_triangle``'s output.

    ``n`` may be omitted; it is then inferred from the length ``n (n + 1) / 2``.
    """
    v = np.asarray(vec, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"packed triangle must be 1-D; got shape {v.shape}")
    if n is None:
        n = int(round((math.sqrt(8 * len(v) + 1) - 1) / 2))
    if n < 1 or len(v) != n * (n + 1) // 2:
        raise ValueError(f"packed triangle has {len(v)} entries; a ({n}, {n}) matrix needs "
                         f"n (n + 1) / 2 = {n * (n + 1) // 2}. Check n (= features + 1)")
    g = np.zeros((n, n))
    rows, cols = np.triu_indices(n)
    g[rows, cols] = v
    g[cols, rows] = v
    return g


def low_rank_factor(g: np.ndarray, rank: int, rows: np.ndarray | None = None,
                    root: torch.Tensor | None = None) -> np.ndarray:
    """``F`` of shape ``(n, rank)``, float32, with ``G ~= F F^T`` (top eigenpairs).

    Columns are ``sqrt(lambda_i) v_i`` for the ``rank`` largest eigenvalues (negative
    rounding noise clipped to 0), in decreasing order. Exact (to float32) at full rank;
    the best rank-``rank`` PSD approximation in Frobenius and spectral norm otherwise (from
    :data:`TOP_EIGEN_MIN_SIZE` inputs, within a few percent of it: :func:`top_eigenpairs`).

    ``rows``: the inputs ``(N, n - 1)`` that ``G`` is the :func:`gram_matrix` of. With
    fewer rows than ``n`` the eigenpairs come from the thin SVD of ``[x, 1] / sqrt(N)``
    (``N x n``) instead of ``G`` (``n x n``): the same pairs, at a fraction of the cost
    (a node of 50 rows with 785 inputs), and zero columns past rank ``N``. ``root``: in
    place of ``rows``, any ``(N, n)`` matrix ``R`` with ``G = R^T R`` (the class-centred
    rows of :func:`within_root`; ``g`` may then be None: no ``(n, n)`` matrix needed).
    """
    t = square_matrix("G", g) if g is not None or root is None else None
    n = len(t) if t is not None else root.shape[1]
    if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= n:
        raise ValueError(f"rank must be an integer in [1, {n}]; got {rank!r}")
    if root is None and rows is not None and 0 < len(rows) < n:
        root = augment(rows) / math.sqrt(len(rows))
    if t is None and len(root) >= n:
        raise ValueError(f"without G, its root must have fewer rows than {n} columns")
    if root is not None and len(root) < n:
        xa = root
        if xa.shape[1] != n:
            raise ValueError(f"rows have {xa.shape[1] - 1} features; G is {n} x {n}")
        _, sing, vh = torch.linalg.svd(xa, full_matrices=False)  # descending
        keep = min(rank, len(sing))
        f = torch.zeros(n, rank, dtype=torch.float64)
        f[:, :keep] = vh[:keep].T * sing[:keep]
        return f.numpy().astype(np.float32)
    if n >= TOP_EIGEN_MIN_SIZE and rank < n:
        lam, vec = top_eigenpairs(0.5 * (t + t.T), rank)
    else:
        lam, vec = torch.linalg.eigh(0.5 * (t + t.T))
    lam = lam[-rank:].flip(0).clamp_min(0.0)
    vec = vec[:, -rank:].flip(1)
    return (vec * lam.sqrt()).numpy().astype(np.float32)


def top_eigenpairs(sym: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rank`` largest eigenvalues (ascending) and their eigenvectors of the PSD
    ``sym``, as float64 tensors, by randomized subspace iteration in float32 (Halko,
    Martinsson & Tropp 2011, algorithms 4.4 and 5.3): :data:`EIGEN_POWER_STEPS` products
    with a seeded block of ``rank`` plus :func:`eigen_oversampling` columns, then the
    eigenpairs of ``sym`` on that block. BLAS-3 products where LAPACK's tridiagonal
    reduction is BLAS-2: 1.2 s against 4.9 s for the kernel model's 3,766-square matrix
    at rank 754 (on one thread, LAPACK on two), its rank-754 approximation's Frobenius error 3.5e-4 of
    ``||G||`` against the optimum's 3.4e-4 (the residual diagonal sent beside the factor
    keeps each direction's own variance either way)."""
    n = sym.shape[0]
    a = sym.to(torch.float32)
    width = min(n, rank + eigen_oversampling(rank))
    draw = torch.Generator().manual_seed(0)
    block = torch.linalg.qr(a @ torch.randn(n, width, generator=draw))[0]
    for _ in range(EIGEN_POWER_STEPS):
        block = torch.linalg.qr(a @ block)[0]
    small = block.T @ a @ block
    lam, vec = torch.linalg.eigh(0.5 * (small + small.T))
    return lam[-rank:].double(), (block @ vec[:, -rank:]).double()


def eigen_oversampling(rank: int) -> int:
    """Columns past ``rank`` in :func:`top_eigenpairs`' block: an eighth, at least 32."""
    return max(32, rank // 8)


def half_factor(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A factor ``(n, r)`` as it travels: ``(vectors, scales)`` with ``F = vectors * scales``,
    ``vectors`` float16 in ``[-1, 1]`` and each column's scale a power of two (float32).

    A power-of-two scale makes the split exact and idempotent: the factor a node keeps,
    ``from_half(*half_factor(F))``, splits again into the same arrays, so the node and
    the server build the same matrix from it. Half the bytes of float32, and a column's
    own scale keeps every entry within float16's range whatever the data's scale.
    """
    t = np.asarray(f, dtype=np.float32)
    if t.ndim != 2 or not np.all(np.isfinite(t)):
        raise ValueError(f"factor must be a finite 2-D array; got shape {t.shape}")
    peak = np.abs(t).max(axis=0, initial=0.0)
    scales = np.exp2(np.ceil(np.log2(np.where(peak > 0, peak, 1.0)))).astype(np.float32)
    return (t / scales).astype(np.float16), scales


def from_half(vectors: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float32 factor ``vectors * scales`` of :func:`half_factor`."""
    return np.asarray(vectors, dtype=np.float32) * np.asarray(scales, dtype=np.float32)


def sent_factor(g: np.ndarray, rank: int, rows: np.ndarray | None = None,
                root: torch.Tensor | None = None) -> np.ndarray:
    """The rank-``rank`` factor of ``G`` as the server receives it (float16 vectors,
    power-of-two scales): :func:`low_rank_factor` through :func:`half_factor`."""
    return from_half(*half_factor(low_rank_factor(g, rank, rows, root)))


def mean_columns(moments: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The class-mean part of a Gram matrix as factor columns ``(n, m)`` float64:
    ``sqrt(pi_c) [mu_c, 1]`` for each of the ``m`` held classes, so that ``G = W + C C^T``
    with ``W`` the within-class scatter (each row less its class mean). Built from the
    label moments as they travel (float32) and the counts, so both ends build the same
    columns."""
    m = np.asarray(moments, dtype=np.float32).astype(np.float64)
    c = np.asarray(counts, dtype=np.float64)
    if m.ndim != 2 or c.shape != (m.shape[0],):
        raise ValueError(f"moments {m.shape} and counts {c.shape} must be (C, n) and (C,)")
    held = np.flatnonzero(c > 0)
    if not len(held):
        raise ValueError("no class has a row: label moments need at least one")
    share = c[held] / c.sum()
    return (m[held] / np.sqrt(share)[:, None]).T


def within_root(rows: np.ndarray, labels: np.ndarray, columns: np.ndarray) -> torch.Tensor:
    """``(N, n)`` float64: each row ``[x, 1]`` less its class's ``[mu_c, 1]`` (the means of
    :func:`mean_columns` ``columns``, held classes in label order), over ``sqrt(N)``: its
    ``R^T R`` is the within-class scatter ``G - C C^T``."""
    y = np.asarray(labels).reshape(-1)
    held = np.unique(y)
    if columns.shape[1] != len(held):
        raise ValueError(f"{columns.shape[1]} mean columns for {len(held)} classes held by the rows")
    share = np.bincount(y)[held] / len(y)
    means = torch.as_tensor(columns.T / np.sqrt(share)[:, None], dtype=torch.float64)
    index = torch.as_tensor(np.searchsorted(held, y))
    return (augment(rows) - means[index]) / math.sqrt(len(y))


def residual_diagonal(g: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``diag(G - F F^T)`` (float32, ``>= 0``): what a rank-r factor leaves out of each
    direction's own variance. Sent beside ``F``, it keeps every input direction a node's
    data vary in constrained by that node (with ``F`` alone, directions outside its top r
    would be free, and the node would lose its say there)."""
    t = square_matrix("G", g)
    f = layer_matrix("factor F", factor)
    if f.shape[0] != t.shape[0]:
        raise ValueError(f"factor has {f.shape[0]} rows; G is {t.shape[0]} x {t.shape[0]}")
    rest = torch.diagonal(t) - (f * f).sum(dim=1)
    return rest.clamp_min(0.0).numpy().astype(np.float32)


def from_factor(f: np.ndarray, residual: np.ndarray | None = None,
                means: np.ndarray | None = None) -> np.ndarray:
    """``F F^T (+ diag(residual)) (+ C C^T)`` in float64 from a ``low_rank_factor``
    output ``(n, r)``, where sent its :func:`residual_diagonal`, and where the factor is
    of the within-class scatter the class-mean columns ``C`` of :func:`mean_columns`."""
    return FactoredGram(f, residual, means).matrix()


class FactoredGram:
    """``G = T T^T (+ diag(residual))``, kept as its factor: ``T`` is a
    :func:`low_rank_factor` ``(n, r)``, beside the class-mean columns of a within-class
    factor (:func:`from_factor`'s arguments). A quadratic form in its metric costs ``C x n
    x r``, not the ``n x n x r`` of forming ``G`` (about a second a kernel node at n =
    4,152)."""

    def __init__(self, factor: np.ndarray, residual: np.ndarray | None = None,
                 means: np.ndarray | None = None) -> None:
        t = layer_matrix("factor F", factor)
        if means is not None:
            t = torch.cat([t, layer_matrix("mean columns", means)], dim=1)
        self._t = t
        self._residual = None
        if residual is not None:
            self._residual = torch.as_tensor(np.asarray(residual), dtype=torch.float64).reshape(-1)
            if len(self._residual) != len(t):
                raise ValueError(f"residual has {len(self._residual)} entries; the factor has "
                                 f"{len(t)} rows")

    shape = property(lambda self: (len(self._t), len(self._t)))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # numpy's consumers: G itself
        return self.matrix() if dtype is None else self.matrix().astype(dtype, copy=False)

    def matrix(self) -> np.ndarray:
        """``G`` itself, ``(n, n)`` float64."""
        g = self._t @ self._t.T
        if self._residual is not None:
            g.diagonal().add_(self._residual)
        return g.numpy()

    def quadratic(self, diff: np.ndarray) -> float:
        """``tr(diff G diff^T)`` for ``diff`` ``(C, n)``."""
        d = layer_matrix("diff", diff)
        value = float((d @ self._t).square().sum())
        if self._residual is not None:
            value += float((d.square() @ self._residual).sum())
        return value


def relative_error(g: np.ndarray, approx: np.ndarray) -> float:
    """``||G - approx||_F / ||G||_F`` (0 when both are zero): how much packing lost."""
    a, b = layer_matrix("G", g), layer_matrix("approx", approx)
    if a.shape != b.shape:
        raise ValueError(f"G has shape {tuple(a.shape)} and approx {tuple(b.shape)}; "
                         "they must match")
    norm = float(torch.linalg.matrix_norm(a))
    diff = float(torch.linalg.matrix_norm(a - b))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def _check_semidefinite(sym: torch.Tensor, tol: float) -> None:
    """ValueError unless the symmetric ``sym``'s smallest eigenvalue is at least
    ``-tol * max(1, largest)``.

    A Cholesky factor of ``G + tol * max(1, max diag) I`` proves the smallest eigenvalue is
    above that bound (the largest eigenvalue is at least the largest diagonal entry) for
    less than an eigenvalue solve costs; only a matrix it does not clear gets one."""
    n = sym.shape[0]
    shifted = sym + tol * max(1.0, float(sym.diagonal().max())) * torch.eye(n, dtype=sym.dtype)
    if int(torch.linalg.cholesky_ex(shifted)[1]) == 0:
        return
    lam = torch.linalg.eigvalsh(sym)
    lo, hi = float(lam[0]), float(lam[-1])
    if lo < -tol * max(1.0, hi):
        raise ValueError(f"Gram matrix is not positive semidefinite: smallest eigenvalue "
                         f"{lo:.3g} < -tol * max(1, largest eigenvalue) = "
                         f"{-tol * max(1.0, hi):.3g}. Reject this reply")


def check_gram(g, n: int, *, tol: float = 1e-6,
               unit_bias_tol: float | None = None) -> np.ndarray:
    """Validate a Gram matrix received from a node; return it as float64 ``(n, n)``.

    Raises ``ValueError`` naming the first problem found:

    * wrong shape (not ``(n, n)``, ``n = features + 1``);
    * NaN or infinite entries;
    * not symmetric: ``max |G - G^T| > tol * max |G|``;
    * not positive semidefinite: smallest eigenvalue ``< -tol * max(1, largest)``;
    * with ``unit_bias_tol`` set, a bias entry ``G[-1, -1]`` farther than that from 1
      (a mean of ``[x, 1][x, 1]^T`` has exactly 1 there; a sum instead of a mean would
      silently reweight the node). Leave it ``None`` for low-rank replies, whose bias
      entry is only approximate.

    Float32 packing keeps a genuine Gram matrix well inside ``tol = 1e-6``.
    """
    arr = np.asarray(g)
    if arr.shape != (n, n):
        raise ValueError(f"Gram matrix has shape {arr.shape}; expected ({n}, {n}) = "
                         f"(features + 1) x (features + 1). Reject this reply")
    try:
        t = torch.as_tensor(arr, dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Gram matrix is not numeric: {exc}. Reject this reply") from exc
    if not all_finite(t):
        raise ValueError("Gram matrix contains NaN or infinite entries. Reject this reply")
    scale = float(t.abs().max())
    asym = float((t - t.T).abs().max())
    if asym > tol * scale:
        raise ValueError(f"Gram matrix is not symmetric: max |G - G^T| = {asym:.3g} exceeds "
                         f"tol * max |G| = {tol * scale:.3g}. Reject this reply")
    _check_semidefinite(0.5 * (t + t.T), tol)
    if unit_bias_tol is not None and abs(float(t[-1, -1]) - 1.0) > unit_bias_tol:
        raise ValueError(f"Gram matrix bias entry G[-1, -1] = {float(t[-1, -1]):.6g}; a mean "
                         f"of [x, 1][x, 1]^T has 1 there (a sum instead of a mean?). "
                         f"Reject this reply")
    return t.numpy()


# ------------------------------------------------------------------------- distances


def gram_distances(ws: np.ndarray, center: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``sqrt(tr((W_i - center) G (W_i - center)^T))`` for a stack ``ws`` ``(p, C, n)``."""
    wt = torch.as_tensor(np.asarray(ws), dtype=torch.float64)
    if wt.ndim != 3:
        raise ValueError(f"ws must be a stack (p, C, n) of models; got shape {tuple(wt.shape)}")
    n = wt.shape[2]
    gt = square_matrix("G", g, n)
    c = center_for("center", center, n)
    if c.shape[0] != wt.shape[1]:
        raise ValueError(f"center has {c.shape[0]} rows but the models have {wt.shape[1]}")
    diff = (wt - c).reshape(-1, n)
    sq = ((diff @ gt) * diff).sum(dim=1).reshape(len(wt), -1).sum(dim=1)
    return sq.clamp_min(0.0).sqrt().numpy()


def expanded_sq_distances(w: torch.Tensor, grams, products, constants) -> list[float]:
    """``tr((W - W_k) G_k (W - W_k)^T)`` for every node, from ``products`` ``W_k G_k`` and
    ``constants`` ``tr(W_k G_k W_k^T)`` computed once: ``<G_k, W^T W> - 2 <W_k G_k, W> + c_k``
    (clipped at 0). One pass over each ``G_k`` (n^2) instead of the product
    ``(W - W_k) G_k`` (C n^2), for searches that evaluate many ``W``. A loop, not one
    stacked (K, n, n) tensor: the pass is memory-bound either way, and a stack would copy
    every Gram matrix (0.5 GB at 100 nodes, n = 785)."""
    wtw = (w.T @ w).reshape(-1)
    return [max(float(torch.dot(gk.reshape(-1), wtw)) - 2.0 * float((hk * w).sum()) + ck, 0.0)
            for gk, hk, ck in zip(grams, products, constants)]


def gram_distance(w: np.ndarray, center: np.ndarray, g: np.ndarray) -> float:
    """``sqrt(tr((W - center) G (W - center)^T))``: RMS logit change on G's inputs.

    Tiny negative values from rounding (an indefinite reply) are clipped to 0.
    """
    wt = layer_matrix("W", w)
    return float(gram_distances(wt.unsqueeze(0).numpy(), center, g)[0])
