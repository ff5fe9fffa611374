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

Public boundary: numpy arrays in and out; torch float64 inside. Nothing here imports
flwr; from gems_fl only the shared interval kernel of the radius search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from gems_fl.geometry.radius import bisect_radius, margin_intervals

#: Default upper end of the radius bisection, in logit units (RMS of the L2 logit
#: change). Trained softmax layers have logit margins of order 1 to 20; a change of
#: RMS 100 in every logit vector is far beyond what keeps any useful accuracy, so a
#: search that still passes at 100 is reported as ``saturated`` instead of guessed.
DEFAULT_R_MAX = 100.0
#: Default bisection width, in the same logit units: 1e-4 of ``DEFAULT_R_MAX``,
#: i.e. 14 bisection steps; each step costs an (N, p) comparison only.
DEFAULT_DELTA = 0.01
#: Default number of surface directions ``p`` (as in the weight-space search).
DEFAULT_NUM_DIRECTIONS = 500
#: Eigenvalues of a Gram matrix at or below ``EIGEN_FLOOR * (largest eigenvalue)`` are
#: treated as zero: float64 rounding in ``G`` is about 1e-16 * n relative, so 1e-10
#: leaves six orders of magnitude of head room while keeping every direction the data
#: actually spans.
EIGEN_FLOOR = 1e-10


# --------------------------------------------------------------------------- helpers


def augment(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[x, 1]`` as float64 torch: inputs for the augmented ``[weight | bias]`` matrix."""
    xt = _matrix("x", x)
    return torch.cat([xt, torch.ones(len(xt), 1, dtype=torch.float64)], dim=1)


def _matrix(name: str, a, *, finite: bool = True) -> torch.Tensor:
    """A 2-D float64 tensor, with a clear error for the wrong rank or non-finite entries."""
    try:
        t = torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a,
                            dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric 2-D array: {exc}") from exc
    if t.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got shape {tuple(t.shape)}")
    if finite and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or infinite entries; clean or drop those rows")
    return t


def _square(name: str, a, n: int | None = None, *, finite: bool = True) -> torch.Tensor:
    t = _matrix(name, a, finite=finite)
    if t.shape[0] != t.shape[1] or (n is not None and t.shape[0] != n):
        want = f"({n}, {n})" if n is not None else "square (n, n)"
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; expected {want} = (features + 1) x "
            f"(features + 1), the mean of [x, 1] [x, 1]^T"
        )
    return t


def _center_for(name: str, center, n: int) -> torch.Tensor:
    w = _matrix(name, center)
    if w.shape[1] != n:
        raise ValueError(
            f"{name} has shape {tuple(w.shape)}; expected (classes, features + 1) = "
            f"(C, {n}) to match the inputs/Gram matrix"
        )
    return w


def _labels(y, num: int, classes: int) -> torch.Tensor:
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


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps is the minimum accuracy, in [0, 1]; got {eps}")
    return eps


def pass_count(eps: float, num: int) -> int:
    """Smallest number of correct samples ``k`` out of ``num`` with ``k / num >= eps``.

    Computed with the same float division the accuracies use, so that "accuracy >= eps"
    and "correct count >= pass_count" agree exactly (``0.7 * 10`` is ``7.000000000000001``
    in floating point, so ``ceil(eps * num)`` alone can be off by one).
    """
    k = min(max(math.ceil(eps * num), 0), num + 1)
    while k > 0 and (k - 1) / num >= eps:
        k -= 1
    while k <= num and k / num < eps:
        k += 1
    return k


def _range_basis(g: torch.Tensor, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of ``g`` above ``floor * (largest eigenvalue)``: ``(lam (m,), V (n, m))``."""
    lam, vec = torch.linalg.eigh(g)
    top = float(lam[-1])
    if not top > 0.0:
        raise ValueError("the Gram matrix has no positive eigenvalue (it is zero or "
                         "negative definite); compute it from at least one input row")
    keep = lam > floor * top
    return lam[keep], vec[:, keep]


def _solve_right(a: torch.Tensor, b: torch.Tensor, floor: float = EIGEN_FLOOR) -> torch.Tensor:
    """``X`` with ``X A = B`` for symmetric PSD ``A`` (so ``A X^T = B^T``).

    Cholesky when ``A`` is numerically positive definite; otherwise the minimum-norm
    solution restricted to ``A``'s range (eigenvalues above ``floor * max``), which is the
    ``ridge -> 0+`` limit of ``(A + ridge I)``.
    """
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        piv = torch.diagonal(chol) ** 2
        if float(piv.min()) > floor * float(torch.diagonal(a).max()):
            return torch.cholesky_solve(b.T.contiguous(), chol).T
    lam, vec = torch.linalg.eigh(a)
    keep = lam > floor * max(float(lam[-1]), 0.0)
    if not bool(keep.any()):
        raise ValueError("the weighted sum of Gram matrices is zero: no node contributes "
                         "any input; check the Gram matrices and weights")
    vk = vec[:, keep]
    return ((b @ vk) / lam[keep]) @ vk.T


# ---------------------------------------------------------------- Gram and packing


def gram_matrix(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """``mean_n x~_n x~_n^T`` with ``x~ = [x, 1]``: one ``(d+1) x N @ N x (d+1)`` matmul.

    Returns a symmetric float64 ``(d + 1, d + 1)`` array. Its last diagonal entry is 1
    and its last row holds ``[mean x, 1]``.
    """
    xt = _matrix("x", x)
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


def pack_triangle(g: np.ndarray) -> np.ndarray:
    """Upper triangle (row-major, diagonal included) of a square matrix as float32 1-D.

    ``n (n + 1) / 2`` numbers; ``unpack_triangle`` restores the symmetric matrix.
    """
    t = _square("G", g).numpy()
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


def low_rank_factor(g: np.ndarray, rank: int) -> np.ndarray:
    """``F`` of shape ``(n, rank)``, float32, with ``G ~= F F^T`` (top eigenpairs).

    Columns are ``sqrt(lambda_i) v_i`` for the ``rank`` largest eigenvalues (negative
    rounding noise clipped to 0), in decreasing order. Exact (to float32) at full rank;
    the best rank-``rank`` PSD approximation in Frobenius and spectral norm otherwise.
    """
    t = _square("G", g)
    n = len(t)
    if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= n:
        raise ValueError(f"rank must be an integer in [1, {n}]; got {rank!r}")
    lam, vec = torch.linalg.eigh(0.5 * (t + t.T))
    lam = lam[-rank:].flip(0).clamp_min(0.0)
    vec = vec[:, -rank:].flip(1)
    return (vec * lam.sqrt()).numpy().astype(np.float32)


def from_factor(f: np.ndarray) -> np.ndarray:
    """``F F^T`` in float64 from a ``low_rank_factor`` output ``(n, r)``."""
    t = _matrix("factor F", f)
    return (t @ t.T).numpy()


def relative_error(g: np.ndarray, approx: np.ndarray) -> float:
    """``||G - approx||_F / ||G||_F`` (0 when both are zero): how much packing lost."""
    a, b = _matrix("G", g), _matrix("approx", approx)
    if a.shape != b.shape:
        raise ValueError(f"G has shape {tuple(a.shape)} and approx {tuple(b.shape)}; "
                         "they must match")
    norm = float(torch.linalg.matrix_norm(a))
    diff = float(torch.linalg.matrix_norm(a - b))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


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
    if not bool(torch.isfinite(t).all()):
        raise ValueError("Gram matrix contains NaN or infinite entries. Reject this reply")
    scale = float(t.abs().max())
    asym = float((t - t.T).abs().max())
    if asym > tol * scale:
        raise ValueError(f"Gram matrix is not symmetric: max |G - G^T| = {asym:.3g} exceeds "
                         f"tol * max |G| = {tol * scale:.3g}. Reject this reply")
    lam = torch.linalg.eigvalsh(0.5 * (t + t.T))
    lo, hi = float(lam[0]), float(lam[-1])
    if lo < -tol * max(1.0, hi):
        raise ValueError(f"Gram matrix is not positive semidefinite: smallest eigenvalue "
                         f"{lo:.3g} < -tol * max(1, largest eigenvalue) = "
                         f"{-tol * max(1.0, hi):.3g}. Reject this reply")
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
    gt = _square("G", g, n)
    c = _center_for("center", center, n)
    if c.shape[0] != wt.shape[1]:
        raise ValueError(f"center has {c.shape[0]} rows but the models have {wt.shape[1]}")
    diff = (wt - c).reshape(-1, n)
    sq = ((diff @ gt) * diff).sum(dim=1).reshape(len(wt), -1).sum(dim=1)
    return sq.clamp_min(0.0).sqrt().numpy()


def gram_distance(w: np.ndarray, center: np.ndarray, g: np.ndarray) -> float:
    """``sqrt(tr((W - center) G (W - center)^T))``: RMS logit change on G's inputs.

    Tiny negative values from rounding (an indefinite reply) are clipped to 0.
    """
    wt = _matrix("W", w)
    return float(gram_distances(wt.unsqueeze(0).numpy(), center, g)[0])


# ------------------------------------------------------------------------ directions


def _whitened_draws(num: int, size: int, seed: int) -> torch.Tensor:
    """``(num, size)`` rows uniform on the unit sphere, seeded, float64."""
    gen = torch.Generator().manual_seed(int(seed))
    # float32 normal draws are cheaper and just as good as random directions.
    u = torch.randn(num, size, generator=gen).to(torch.float64)
    return u / torch.linalg.vector_norm(u, dim=1, keepdim=True)


def _check_search_ints(num_directions: int) -> None:
    if not isinstance(num_directions, (int, np.integer)) or num_directions < 1:
        raise ValueError(f"num_directions must be a positive integer; got {num_directions!r}")


def sample_gram_directions(
    num_directions: int, shape: tuple[int, int], g: np.ndarray, seed: int,
    *, floor: float = EIGEN_FLOOR,
) -> np.ndarray:
    """``p`` directions ``D`` with ``tr(D G D^T) = 1``, shape ``(p, C, n)``, float64.

    With ``G = V diag(lambda) V^T`` restricted to eigenvalues above ``floor * max``
    (``m`` of them), ``D = (U diag(lambda)^(-1/2)) V_m^T`` with ``U`` ``(C, m)`` uniform on
    the unit sphere. ``D G^(1/2)`` -- the logit change the direction causes, in the
    node's whitened input coordinates -- is thus uniform on the unit sphere: "uniform on
    the surface" in the geometry the space is defined by.

    Null space: along an eigenvector with (numerically) zero eigenvalue no logit on the
    node's training inputs changes, so the ellipsoid is unbounded there and there is no
    unit length to scale a direction by (``tr(D G D^T) = 0``). Such moves may well
    change logits on *other* inputs (the validation set, the test set); but the space is
    defined by the training inputs, and the boundary the radius search probes exists
    only in the range of ``G``. Directions therefore live in that range; the server's
    aggregation fixes the null-space components (ridge / minimum norm).

    Deterministic for a given ``seed`` (``torch.Generator``) and ``G``.
    """
    _check_search_ints(num_directions)
    classes, n = int(shape[0]), int(shape[1])
    gt = _square("G", g, n)
    lam, vec = _range_basis(gt, floor)
    u = _whitened_draws(num_directions, classes * len(lam), seed)
    u = u.reshape(num_directions, classes, len(lam)) / lam.sqrt()
    return (u @ vec.T).numpy()


# --------------------------------------------------------------------- radius search


@dataclass(frozen=True)
class GramRadiusResult:
    """Outcome of one Gram radius search (radii in logit units, metric ``G``).

    ``radius`` is the largest radius that was tested and at which every sampled
    direction kept accuracy >= eps (0 when the center itself fails). ``saturated``:
    ``r_max`` itself passed, so the true radius may be larger. ``failed_radius`` is the
    smallest tested radius at which some direction failed (``inf`` when none failed), so
    ``failed_radius - radius <= delta`` when not saturated. ``rank`` is the number of
    eigen-directions of ``G`` the directions span, per class.
    """

    radius: float
    center_accuracy: float
    center_passes: bool
    min_accuracy_at_radius: float
    steps: int
    saturated: bool
    failed_radius: float = math.inf
    rank: int = 0


def search_gram_radius(
    center: np.ndarray,
    g: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    *,
    eps: float,
    num_directions: int = DEFAULT_NUM_DIRECTIONS,
    r_max: float = DEFAULT_R_MAX,
    delta: float = DEFAULT_DELTA,
    seed: int = 0,
    floor: float = EIGEN_FLOOR,
    chunk: int = 64,
) -> GramRadiusResult:
    """Largest radius ``R`` in the metric ``G`` such that every sampled model
    ``center + R * D`` (``D`` from ``sample_gram_directions``) keeps validation
    accuracy >= eps.

    Bisection over ``[0, r_max]`` down to width ``delta``; ``r_max`` is tested first and,
    when it passes, returned with ``saturated=True``. Vectorised: the logits of
    ``W + r D`` are ``Z0 + r (Xa D^T)``, so the margins of each sample against each class
    are affine in ``r`` and the radii where a sample stays correct form an interval. The
    intervals for all ``N`` samples and ``p`` directions are computed in one batched pass
    (``chunk`` directions at a time to bound memory); every bisection step is then a
    comparison of ``(N, p)`` numbers. ``Xa D^T`` is formed as
    ``(Xa V_m diag(lambda)^(-1/2)) U^T`` without materialising ``D``.

    Parameters
    ----------
    center : (C, d + 1) augmented ``[weight | bias]`` matrix of the node's model.
    g : (d + 1, d + 1) the node's Gram matrix (training inputs).
    x_val, y_val : validation inputs ``(N, d)`` and labels ``(N,)``.
    eps : minimum accuracy of a good-enough model.
    num_directions, r_max, delta, seed : see the module defaults.
    """
    eps = _check_eps(eps)
    _check_search_ints(num_directions)
    if not (math.isfinite(r_max) and r_max > 0):
        raise ValueError(f"r_max must be a positive finite radius (logit units); got {r_max}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be a positive bisection width; got {delta}")
    xa = augment(x_val)
    n = xa.shape[1]
    if len(xa) == 0:
        raise ValueError("the validation set is empty: a radius needs validation data")
    w = _center_for("center", center, n)
    gt = _square("G", g, n)
    yt = _labels(y_val, len(xa), w.shape[0])
    num, classes = len(xa), w.shape[0]
    need = pass_count(eps, num)

    z0 = xa @ w.T
    correct0 = int((z0.argmax(dim=1) == yt).sum())
    center_acc = correct0 / num
    if correct0 < need:
        return GramRadiusResult(0.0, center_acc, False, center_acc, 0, False, 0.0, 0)

    lam, vec = _range_basis(gt, floor)
    m = len(lam)
    xw = (xa @ vec) / lam.sqrt()  # (N, m): whitened inputs
    u = _whitened_draws(num_directions, classes * m, seed).reshape(-1, m)  # (p*C, m)
    idx = yt.view(-1, 1)
    margin = z0.gather(1, idx) - z0  # (N, C): >= 0 means correct against class c
    off = torch.ones_like(margin, dtype=torch.bool).scatter_(1, idx, False)
    # "Clean" samples: correct at the center with every other class strictly behind.
    # Their interval is [0, hi] with hi = 1 / max_c max(0, (s_c - s_y) / m_c), where s
    # is the logit slope: one subtraction, one product and one max per entry. The
    # others (wrong at the center, or tied) take the general interval computation.
    clean = torch.where(off, margin, torch.ones(())).gt(0).all(dim=1)
    # Clean rows first, so that both groups are contiguous slices (the accuracy counts
    # sum over rows and do not care about their order).
    order = torch.argsort((~clean).to(torch.uint8), stable=True)
    n_clean = int(clean.sum())
    xw, margin, off, idx = xw[order], margin[order], off[order], idx[order]
    inv_margin = torch.where(off, 1.0 / margin, torch.zeros(()))[:n_clean].unsqueeze(1)
    o_margin = margin[n_clean:].unsqueeze(1)
    # (p, N) layout: each bisection step reduces along contiguous rows.
    lo = torch.zeros(num_directions, num, dtype=torch.float64)
    hi = torch.empty_like(lo)
    for start in range(0, num_directions, chunk):
        stop = min(start + chunk, num_directions)
        slopes = (xw @ u[start * classes: stop * classes].T).reshape(num, -1, classes)
        at_y = slopes.gather(2, idx.view(-1, 1, 1).expand(-1, stop - start, 1))
        if n_clean:
            rate = ((slopes[:n_clean] - at_y[:n_clean]) * inv_margin).amax(dim=2)
            hi[start:stop, :n_clean] = (1.0 / rate.clamp_min(0.0)).T
        if n_clean < num:
            slope = at_y[n_clean:] - slopes[n_clean:]
            lo_o, hi_o = margin_intervals(o_margin, slope)
            lo[start:stop, n_clean:], hi[start:stop, n_clean:] = lo_o.T, hi_o.T

    def min_count(radius: float) -> int:
        inside = hi[:, :n_clean] >= radius  # clean samples: lo = 0
        count = torch.count_nonzero(inside, dim=1)
        if n_clean < num:
            rest = (lo[:, n_clean:] <= radius) & (hi[:, n_clean:] >= radius)
            count = count + torch.count_nonzero(rest, dim=1)
        return int(count.min())

    b = bisect_radius(min_count, lambda count: count >= need, r_max, delta, correct0)
    return GramRadiusResult(b.radius, center_acc, True, b.score / num, b.steps, b.saturated,
                            b.failed_radius, m)


# ------------------------------------------------------------------ certified radius


def _margins(center, x_val, y_val) -> tuple[torch.Tensor, int]:
    xa = augment(x_val)
    if len(xa) == 0:
        raise ValueError("the validation set is empty: a radius needs validation data")
    w = _center_for("center", center, xa.shape[1])
    if w.shape[0] < 2:
        raise ValueError("a classifier needs at least 2 classes (rows of center)")
    yt = _labels(y_val, len(xa), w.shape[0])
    z = xa @ w.T
    zy = z.gather(1, yt.view(-1, 1)).squeeze(1)
    others = z.scatter(1, yt.view(-1, 1), -math.inf)
    return zy - others.amax(dim=1), len(xa)


def certified_radius_in_metric(center: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                               eps: float) -> float:
    """Certified radius ``rho`` in the metric of the validation inputs' own logits.

    Sound for ``G_val = mean over validation x~ x~^T``: every ``D`` with
    ``tr(D G_val D^T) <= rho^2`` keeps validation accuracy >= eps (ties count as
    correct). ``0`` when the center fails eps, ``inf`` when eps is 0.

    Proof. Sample ``n`` with margin ``m_n = z_y - max_{c != y} z_c >= 0`` becomes wrong
    only if some ``z_c`` strictly exceeds ``z_y``; the smallest L2 change of its logit
    vector that achieves that is (in the limit) ``m_n / sqrt(2)`` (half the margin off
    ``z_y``, half onto ``z_c``). With ``K`` samples correct and ``k = pass_count(eps, N)``,
    accuracy < eps needs at least ``f = K - k + 1`` currently-correct samples to flip
    (wrong samples turning correct only help). Since
    ``tr(D G_val D^T) = (1/N) sum_n ||D x~_n||^2``, flipping any ``f`` samples needs
    ``tr(D G_val D^T) > (1/N) * (sum of the f smallest m_n^2 / 2) = rho^2``.
    The bound is tight when the ``x~_n`` are linearly independent (``N <= d + 1``).
    """
    eps = _check_eps(eps)
    margin, num = _margins(center, x_val, y_val)
    correct = margin >= 0
    k_pass = pass_count(eps, num)
    k_correct = int(correct.sum())
    if k_correct < k_pass:
        return 0.0
    if k_pass == 0:
        return math.inf
    flips = k_correct - k_pass + 1
    cost = (margin[correct] ** 2 / 2).sort().values[:flips].sum()
    return math.sqrt(float(cost) / num)


def certified_gram_radius(
    center: np.ndarray,
    g: np.ndarray | None,
    x_val: np.ndarray,
    y_val: np.ndarray,
    eps: float,
    *,
    floor: float = EIGEN_FLOOR,
    within_range: bool = False,
) -> float:
    """Certified radius (closed form) in the metric ``G`` -- the node's training Gram.

    ``g=None`` (or ``g = G_val``) returns ``certified_radius_in_metric``: the radius in
    the metric of the validation inputs. For another ``G`` the validation-metric radius
    ``rho_val`` is converted with the largest generalised eigenvalue

        mu = max_D tr(D G_val D^T) / tr(D G D^T) = lambda_max(G^(-1/2) G_val G^(-1/2)),

    (the quotient splits over the rows of ``D``, so the ``(d+1)``-dimensional problem
    suffices): ``tr(D G D^T) <= rho_val^2 / mu`` implies ``tr(D G_val D^T) <= rho_val^2``,
    so ``rho_val / sqrt(mu)`` is sound in the metric ``G``.

    If ``G_val`` has weight on ``G``'s null space (eigenvalues below ``floor * max``: an
    input feature constant on the training data but not on the validation data) the
    ``G``-ellipsoid contains unbounded moves that change validation logits, and the
    sound radius for the whole ellipsoid is 0. With ``within_range=True`` only
    perturbations in the range of ``G`` are certified -- exactly those that
    ``sample_gram_directions`` / ``search_gram_radius`` probe.
    """
    rho = certified_radius_in_metric(center, x_val, y_val, eps)
    if g is None or rho == 0.0 or math.isinf(rho):
        return rho
    xa_n = np.shape(x_val)[1] + 1
    gt = _square("G", g, xa_n)
    g_val = torch.as_tensor(gram_matrix(x_val))
    lam, vec = torch.linalg.eigh(gt)
    if not float(lam[-1]) > 0.0:
        raise ValueError("G has no positive eigenvalue; compute it from the training inputs")
    keep = lam > floor * float(lam[-1])
    if not within_range and not bool(keep.all()):
        null = vec[:, ~keep]
        leak = float(torch.linalg.eigvalsh(null.T @ g_val @ null)[-1])
        if leak > floor * float(torch.linalg.eigvalsh(g_val)[-1]):
            return 0.0
    vm = vec[:, keep] / lam[keep].sqrt()
    mu = float(torch.linalg.eigvalsh(vm.T @ g_val @ vm)[-1])
    if mu <= 0.0:
        return math.inf  # no move in G's range changes any validation logit
    return rho / math.sqrt(mu)


# -------------------------------------------------------------------- server side


def _node_inputs(centers: Sequence, grams: Sequence, what: str = "grams"):
    if len(centers) == 0:
        raise ValueError("no nodes: pass at least one center and Gram matrix")
    if len(centers) != len(grams):
        raise ValueError(f"got {len(centers)} centers but {len(grams)} {what}; "
                         "pass one of each per node")
    ws = [_matrix(f"centers[{i}]", c) for i, c in enumerate(centers)]
    shape = tuple(ws[0].shape)
    for i, w in enumerate(ws):
        if tuple(w.shape) != shape:
            raise ValueError(f"centers[{i}] has shape {tuple(w.shape)} but centers[0] has "
                             f"{shape}; every node must share the layer shape (C, d + 1)")
    # Shapes only: finiteness and PSD are check_gram's job when a reply arrives; a full
    # scan of 100 Gram matrices here would cost as much as the aggregation itself.
    gs = [_square(f"grams[{i}]", g, shape[1], finite=False) for i, g in enumerate(grams)]
    return ws, gs


def _weights(name: str, values, k: int) -> torch.Tensor:
    w = torch.as_tensor(np.asarray(values, dtype=np.float64))
    if w.shape != (k,):
        raise ValueError(f"{name} must have one entry per node ({k}); got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0; got {w.tolist()}")
    return w


def gram_center(
    centers: Sequence[np.ndarray],
    grams: Sequence[np.ndarray],
    weights: Sequence[float] | None = None,
    ridge: float = 0.0,
) -> np.ndarray:
    """Closed-form minimiser of ``sum_k l_k tr((W - W_k) G_k (W - W_k)^T) + ridge ||W||^2``.

    ``W = (sum_k l_k W_k G_k) (sum_k l_k G_k + ridge I)^-1``, computed by a Cholesky solve
    of the symmetric system (no explicit inverse). ``l = weights / sum(weights)``:
    normalised, so ``ridge`` is on the scale of one (mean) Gram matrix whatever the
    weights. Pass the nodes' training sample counts (then the objective is the squared
    logit change summed over all training inputs) or ``1 / rho_k^2`` (each node's
    distance relative to its radius); ``None`` means equal weights.

    With ``ridge=0`` and a singular ``sum_k l_k G_k`` (an input feature no node ever
    varies) the minimum-norm minimiser is returned -- the ``ridge -> 0+`` limit: it sets
    the components no node's logits depend on to 0.
    """
    ws, gs = _node_inputs(centers, grams)
    k = len(ws)
    lw = _weights("weights", np.ones(k) if weights is None else weights, k)
    total = float(lw.sum())
    if total <= 0:
        raise ValueError("weights sum to 0; at least one node needs a positive weight")
    lw = lw / total
    ridge = float(ridge)
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be finite and >= 0; got {ridge}")
    n = gs[0].shape[0]
    a = torch.zeros(n, n, dtype=torch.float64)
    b = torch.zeros(ws[0].shape, dtype=torch.float64)
    for lk, wk, gk in zip(lw.tolist(), ws, gs):
        if lk == 0.0:
            continue
        a.add_(gk, alpha=lk)
        b.addmm_(wk, gk, alpha=lk)
    a = 0.5 * (a + a.T)
    if ridge > 0:
        a.diagonal().add_(ridge)
    w = _solve_right(a, b)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the aggregated model is not finite: a center or Gram matrix holds "
                         "NaN/inf; validate each reply with check_gram first")
    return w.numpy()


def _radii(radii, k: int) -> torch.Tensor:
    r = torch.as_tensor(np.asarray(radii, dtype=np.float64))
    if r.shape != (k,):
        raise ValueError(f"radii must have one entry per node ({k}); got shape {tuple(r.shape)}")
    if bool(torch.isnan(r).any()) or bool((r < 0).any()):
        raise ValueError(f"radii must be >= 0 (inf allowed: unconstrained); got {r.tolist()}")
    return r


def _sq_dist(w: torch.Tensor, wk: torch.Tensor, gk: torch.Tensor) -> float:
    d = w - wk
    return max(float(((d @ gk) * d).sum()), 0.0)


def _scaled(dist: float, rho: float) -> float:
    if math.isinf(rho):
        return 0.0
    if rho == 0.0:
        return 0.0 if dist == 0.0 else math.inf
    return dist / rho


def minimax_gram_point(
    centers: Sequence[np.ndarray],
    grams: Sequence[np.ndarray],
    radii: Sequence[float],
    *,
    max_iter: int = 500,
    tol: float = 1e-6,
    return_info: bool = False,
    decide_at: float | None = None,
):
    """The point minimising ``max_k ||W - W_k||_{G_k} / rho_k``, and that maximum.

    ``decide_at`` (e.g. 1.0: do the spaces share a point?) stops as soon as the bracket
    settles the question: the best point's maximum is <= ``decide_at`` (a point in
    every space is found), or the lower bound is above it (no such point exists). The
    returned maximum is then an upper bound on the optimum, not the optimum itself.

    Returns ``(W, max_scaled_distance)``; ``max_scaled_distance <= 1`` means ``W`` lies in
    every node's space. With ``return_info=True`` a third item, a dict with
    ``scaled_distances`` (per node), ``lower_bound`` (a certified lower bound on the
    optimum), ``iterations``, ``converged``, ``weights`` (dual weights, per node) and
    ``excluded`` (indices of nodes with radius 0 or inf).

    Method: the convex problem ``min_W max_k q_k(W)`` with ``q_k = ||W - W_k||^2 / rho_k^2``
    has the dual ``max_{lambda in simplex} g(lambda)``, ``g(lambda) = min_W sum_k
    lambda_k q_k(W)``, whose inner minimiser is the closed-form center with weights
    ``lambda_k / rho_k^2`` and whose gradient is ``q_k(W(lambda))``. Starting from the
    closed form with weights ``1 / rho_k^2`` (uniform ``lambda``), the weights are
    updated multiplicatively toward the worst nodes, ``lambda_k <- lambda_k
    (q_k / g)^beta``, with ``beta`` grown while the dual improves and halved when it
    does not. Weak duality brackets the optimum: ``sqrt(g) <= opt <= sqrt(max_k q_k)``;
    iteration stops when the relative gap is below ``tol`` (or after ``max_iter``) and
    the best primal point is returned.

    Nodes with ``rho_k = 0`` (center failed eps) have infinite scale: they are left out
    of the optimisation and their scaled distance is ``inf`` (0 only at exactly their
    center), so the returned maximum is ``inf``. Nodes with ``rho_k = inf`` impose no
    constraint. With no constrained node left, the equal-weight ``gram_center`` of all
    nodes is returned.
    """
    ws, gs = _node_inputs(centers, grams)
    k = len(ws)
    r = _radii(radii, k)
    active = [i for i in range(k) if 0.0 < float(r[i]) < math.inf]
    excluded = [i for i in range(k) if i not in active]
    info: dict = {"iterations": 0, "converged": True, "excluded": excluded,
                  "weights": np.zeros(k)}

    if not active:
        w_best = torch.as_tensor(gram_center(ws, gs))
        lower = 0.0
    else:
        ga = [gs[i] for i in active]
        wa = [ws[i] for i in active]
        inv_r2 = [1.0 / float(r[i]) ** 2 for i in active]
        h = [wk @ gk for wk, gk in zip(wa, ga)]  # W_k G_k, reused every iteration
        c = [float((hk * wk).sum()) for hk, wk in zip(h, wa)]  # tr(W_k G_k W_k^T)
        n = ga[0].shape[0]

        def solve(lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = torch.zeros(n, n, dtype=torch.float64)
            b = torch.zeros(wa[0].shape, dtype=torch.float64)
            for lk, s, gk, hk in zip(lam.tolist(), inv_r2, ga, h):
                if lk > 0.0:
                    a.add_(gk, alpha=lk * s)
                    b.add_(hk, alpha=lk * s)
            w = _solve_right(0.5 * (a + a.T), b)
            # q_k = <G_k, W^T W> - 2 <W_k G_k, W> + tr(W_k G_k W_k^T): one pass over each
            # G_k (n^2) instead of the product (W - W_k) G_k (C n^2), C times the work.
            # A loop, not one stacked (K, n, n) tensor: the pass is memory-bound either
            # way, and a stack would copy every Gram matrix (0.5 GB at 100 nodes, n = 785).
            wtw = (w.T @ w).reshape(-1)
            q = torch.tensor([max(float(torch.dot(gk.reshape(-1), wtw))
                                  - 2.0 * float((hk * w).sum()) + ck, 0.0) * s
                              for gk, hk, ck, s in zip(ga, h, c, inv_r2)], dtype=torch.float64)
            return w, q

        lam = torch.full((len(active),), 1.0 / len(active), dtype=torch.float64)
        w, q = solve(lam)
        dual = float((lam * q).sum())
        w_best, primal = w, float(q.max())
        lower, beta = dual, 1.0
        info["converged"] = False
        for it in range(1, max_iter + 1):
            info["iterations"] = it
            if math.sqrt(primal) - math.sqrt(max(lower, 0.0)) <= tol * math.sqrt(primal):
                info["converged"] = True
                break
            if dual <= 0.0:  # every active center coincides with W: optimum 0
                info["converged"] = True
                break
            if decide_at is not None and (primal <= decide_at ** 2 or lower > decide_at ** 2):
                info["decided"] = True
                break
            trial = lam * (q / dual).clamp_min(1e-300) ** beta
            trial = trial / trial.sum()
            w_t, q_t = solve(trial)
            dual_t = float((trial * q_t).sum())
            if float(q_t.max()) < primal:
                w_best, primal = w_t, float(q_t.max())
            if dual_t > dual:
                lam, w, q, dual = trial, w_t, q_t, dual_t
                lower = max(lower, dual)
                beta = min(beta * 1.5, 16.0)
            else:
                beta *= 0.5
                if beta < 1e-8:
                    info["converged"] = True  # no ascent left at machine precision
                    break
        full = np.zeros(k)
        full[active] = lam.numpy()
        info["weights"] = full

    scaled = [_scaled(math.sqrt(_sq_dist(w_best, ws[i], gs[i])), float(r[i])) for i in range(k)]
    worst = max(scaled)
    info["scaled_distances"] = np.array(scaled)
    # A lower bound for the nodes with finite positive radius; adding the others only
    # raises the optimum, so it bounds the full problem too.
    info["lower_bound"] = math.sqrt(max(lower, 0.0))
    if return_info:
        return w_best.numpy(), worst, info
    return w_best.numpy(), worst


class Membership(NamedTuple):
    """One node's verdict on a model: its Gram distance, radius, and the shortfall."""

    distance: float
    radius: float
    inside: bool
    miss: float


def membership(
    w: np.ndarray,
    centers: Sequence[np.ndarray],
    grams: Sequence[np.ndarray],
    radii: Sequence[float],
    *,
    rtol: float = 1e-9,
) -> list[Membership]:
    """Per node: ``distance = ||W - W_k||_{G_k}``, ``radius = rho_k``,
    ``inside = distance <= rho_k (1 + rtol)`` (rtol absorbs rounding at a boundary point
    such as the minimax solution), ``miss = max(distance - rho_k, 0)``.
    """
    ws, gs = _node_inputs(centers, grams)
    r = _radii(radii, len(ws))
    wt = _center_for("W", w, ws[0].shape[1])
    if wt.shape != ws[0].shape:
        raise ValueError(f"W has shape {tuple(wt.shape)}; the nodes' models have "
                         f"{tuple(ws[0].shape)}")
    out = []
    for wk, gk, rk in zip(ws, gs, r.tolist()):
        dist = math.sqrt(_sq_dist(wt, wk, gk))
        out.append(Membership(dist, rk, dist <= rk * (1.0 + rtol), max(dist - rk, 0.0)))
    return out
