"""Diagonal Fisher information of a softmax-linear model and ellipsoid axes from it."""

from __future__ import annotations

import numpy as np
import torch

from gems_fl.geometry.radius import augment


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


def fisher_axes(fisher: np.ndarray, c: float) -> np.ndarray:
    """Relative axes ``max(min_j F_j / F_i, c)`` in ``[c, 1]``, flattened.

    Entries at the minimum (in particular zero Fisher: blank pixels, classes the node
    never predicts) get the longest axis 1, the limit of the formula as ``F_i -> min F``.
    """
    f = np.asarray(fisher, dtype=np.float64).reshape(-1)
    f_min = f.min()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(f <= f_min, 1.0, f_min / f)
    return np.maximum(ratio, c)
