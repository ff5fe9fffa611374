"""Diagonal Fisher information of a softmax-linear model and ellipsoid axes from it."""

from __future__ import annotations

import numpy as np
import torch

from gems_fl.geometry.choices import ELLIPSOID_FLOORS as FLOORS
from gems_fl.geometry.linalg import augment


def diagonal_fisher(center: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Diagonal of the expected Fisher information at ``center``.

    For ``p = softmax(W xa)`` and labels drawn from the model itself,
    ``E_y[(dlog p_y / dW_cj)^2] = p_c (1 - p_c) xa_j^2``, so the diagonal is
    ``mean_n p_nc (1 - p_nc) xa_nj^2``: closed form, no label sampling.

    Returns an array shaped like ``center`` (``(C, F + 1)``).
    """
    xa = augment(x)
    w = torch.as_tensor(np.asarray(center, dtype=np.float64))
    probs = torch.softmax(xa @ w.T, dim=1)
    fisher = (probs * (1.0 - probs)).T @ (xa * xa) / len(xa)
    return fisher.numpy()


FLOOR_QUANTILE = 0.05


def fisher_axes(fisher: np.ndarray, c: float, floor: str = "quantile") -> np.ndarray:
    """Relative ellipsoid axes in ``[c, 1]``, flattened: ``max(F_ref / F_i, c)``.

    ``floor='paper'`` is appendix A's ``F_ref = min_j F_j``. When some Fisher entries
    are 0 (blank pixels, classes the node never predicts) that minimum is 0 and every
    other axis collapses to ``c``: the ellipsoid is then a ball of radius ``c R``.
    ``floor='quantile'`` (the default) takes ``F_ref`` as the 5 % quantile of the
    *nonzero* entries instead, so the axes keep following the Fisher information.
    Entries at or below ``F_ref`` (zeros included) get the longest axis 1.
    """
    if floor not in FLOORS:
        raise ValueError(f"floor={floor!r}; choose one of {', '.join(FLOORS)}")
    f = np.asarray(fisher, dtype=np.float64).reshape(-1)
    if floor == "paper":
        f_ref = f.min()
    else:
        nonzero = f[f > 0]
        f_ref = float(np.quantile(nonzero, FLOOR_QUANTILE)) if nonzero.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(f <= f_ref, 1.0, f_ref / f)
    return np.maximum(ratio, c)
