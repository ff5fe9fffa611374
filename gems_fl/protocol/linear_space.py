"""A node's good-enough space for one linear layer: the convex model, or an MLP's
output layer on its frozen hidden features.

One function for every kind of space (``space`` setting):

- ``gram``: the logit-space ellipsoid ``tr((W - W_k) G_k (W - W_k)^T) <= rho^2`` with
  ``G_k`` the mean of ``x~ x~^T`` over the node's training inputs;
- ``ball`` and ``ellipsoid``: the paper's parameter-space spaces (ellipsoid axes from
  the diagonal Fisher information, appendix A).

Each gets the same batched bisection on the validation split (the largest radius
tested and passed by ``p`` surface samples) and a closed-form certified radius.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gems_fl.geometry.certify import certified_gram_radius, certified_radius
from gems_fl.geometry.fisher import diagonal_fisher, fisher_axes
from gems_fl.geometry.gram import from_factor, gram_matrix, low_rank_factor
from gems_fl.geometry.gram_search import search_gram_radius
from gems_fl.geometry.radius import search_radius
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.settings import Settings


@dataclass
class LayerSpace:
    """A linear layer's good-enough space and how it was found."""

    space: Space | GramSpace
    certified_radius: float
    center_accuracy: float
    factor: np.ndarray | None = None  # the rank-r factor of G sent instead of G


def linear_layer_space(
    center: np.ndarray, train_inputs: np.ndarray, val_inputs: np.ndarray, y_val: np.ndarray,
    settings: Settings, seed: int,
) -> LayerSpace:
    """The good-enough space of the ``(C, n)`` layer ``center`` (bias last) on the
    node's inputs to that layer (``train_inputs`` for the Gram matrix,
    ``val_inputs``/``y_val`` for the radius search and the certified radius)."""
    center = np.asarray(center, dtype=np.float64)
    search_kw = dict(eps=settings.eps, num_directions=settings.num_directions,
                     r_max=settings.r_max, delta=settings.delta, seed=seed)
    if settings.space == "gram":
        gram = gram_matrix(train_inputs)
        factor = None
        if settings.gram_rank > 0:
            factor = low_rank_factor(gram, min(settings.gram_rank, gram.shape[0]))
            gram = from_factor(factor)  # the node's space is the one the server will hold
        search = search_gram_radius(center, gram, val_inputs, y_val, **search_kw)
        cert = certified_gram_radius(center, gram, val_inputs, y_val, settings.eps)
        return LayerSpace(GramSpace(center.reshape(-1), gram, search.radius, cert), cert,
                          search.center_accuracy, factor)
    axes = None
    if settings.space == "ellipsoid":
        axes = fisher_axes(diagonal_fisher(center, val_inputs), settings.ellipsoid_c,
                           settings.ellipsoid_floor)
    search = search_radius(center, val_inputs, y_val, axes=axes, **search_kw)
    cert = certified_radius(center, val_inputs, y_val, settings.eps, axes)
    return LayerSpace(Space(center.reshape(-1), search.radius, axes), cert,
                      search.center_accuracy)
