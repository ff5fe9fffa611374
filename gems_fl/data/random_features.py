"""Random-feature maps: a fixed nonlinear map ``z(x)`` every node builds from the run seed.

``model='random-features'`` fits GEMS's convex model (the softmax-linear output layer) on
``z(x)`` instead of on ``x``. The map costs no communication: its weights are drawn from
the run's seed on every node and on the server, bit for bit the same (numpy's PCG64
stream, float64, then rounded once to float32). Its one data-dependent number, the
bandwidth, comes from the identity round's per-feature sums (the pooled rows' spread,
whatever the split), or from the ``rf-bandwidth`` setting.

- ``fourier``: ``sqrt(2 / D) cos(x W / s + b)``, ``W ~ N(0, 1)``, ``b ~ U(0, 2 pi)``
  (Rahimi and Recht 2007: the Gaussian kernel of width ``s``). ``|z(x)| <= sqrt(2)``.
- ``relu``: ``sqrt(2 / D) max(0, x W / s + b')``, ``b' ~ N(0, 1)``.

Everything downstream (Gram spaces, pooled and LDA points, refinement, secure sums, DP,
node-side verification) sees ``z(x)`` as the features: the protocol is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

import numpy as np

from gems_fl.data.feature_map import MapEvidence
from gems_fl.data.site_files import pooled_moments


class RandomMap(StrEnum):
    """The random-feature maps (``rf-map``): each is one entry of the tables below."""

    FOURIER = "fourier"
    RELU = "relu"


MAPS = tuple(m.value for m in RandomMap)
SEED_OFFSET = 0x5EED_0F_2F  # the map's stream differs from every other draw of the seed
BANDWIDTH_FACTOR = 0.6  # times the RMS distance between two rows (see bandwidth_from_stats)
FOURIER_NORM = float(np.sqrt(2.0))  # |z(x)| <= sqrt(2) for Fourier features: DP's clip
CHUNK_ROWS = 4096  # rows mapped at once: bounds the float64 temporary to CHUNK_ROWS x D
#: each map's offsets ``b`` (drawn after ``W`` from the map's stream) and its nonlinearity
_OFFSETS = {RandomMap.FOURIER: lambda rng, dim: rng.uniform(0.0, 2.0 * np.pi, dim),
            RandomMap.RELU: lambda rng, dim: rng.standard_normal(dim)}
_NONLINEARITY = {RandomMap.FOURIER: np.cos, RandomMap.RELU: lambda pre: np.maximum(pre, 0.0)}
#: the largest norm a mapped row can have, whatever the row (DP's clip is never above it)
NORM_BOUND = {RandomMap.FOURIER: FOURIER_NORM, RandomMap.RELU: float("inf")}


@dataclass(frozen=True)
class RandomFeatures:
    """One random-feature map: its kind, input and output widths, bandwidth and seed."""

    kind: str
    num_inputs: int
    dim: int
    bandwidth: float
    seed: int

    JSON_KEY = "random_features"  # results.json's dataset record names the map by it

    def __post_init__(self) -> None:
        if self.kind not in MAPS:
            raise ValueError(f"rf-map={self.kind!r}: choose one of {', '.join(MAPS)}")
        if self.dim < 1 or self.num_inputs < 1:
            raise ValueError(f"a random-feature map needs positive widths, got {self.num_inputs} "
                             f"inputs and rf-dim={self.dim}")
        if not np.isfinite(self.bandwidth) or self.bandwidth <= 0:
            raise ValueError(f"rf-bandwidth={self.bandwidth!r} must be a positive number")

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W / s, b)`` as float32, ``W`` of shape ``(num_inputs, dim)``."""
        return _weights(self.kind, self.num_inputs, self.dim, float(self.bandwidth), int(self.seed))

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``z(x)`` of shape ``(n, dim)``, float32."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.num_inputs:
            raise ValueError(f"the random-feature map takes {self.num_inputs} features, got an "
                             f"array of shape {x.shape}")
        w, b = self.weights()
        out = np.empty((len(x), self.dim), dtype=np.float32)
        scale = np.float32(np.sqrt(2.0 / self.dim))
        nonlinearity = _NONLINEARITY[RandomMap(self.kind)]
        for start in range(0, len(x), CHUNK_ROWS):
            pre = x[start:start + CHUNK_ROWS] @ w + b
            out[start:start + CHUNK_ROWS] = scale * nonlinearity(pre)
        return out

    def to_config(self, whole: bool = True) -> dict[str, Any]:
        """The map as message config keys (``whole`` has no part to leave out here: the
        seed draws the map)."""
        return self.to_json()

    def to_json(self) -> dict[str, Any]:
        return {"rf-map": self.kind, "rf-inputs": int(self.num_inputs), "rf-dim": int(self.dim),
                "rf-bandwidth": float(self.bandwidth), "rf-seed": int(self.seed)}

    raw_columns = 0  # no column of z(x) is a row's own feature

    def describe(self) -> str:
        """The map in words, for the run plan."""
        return f"{self.kind} random features, D={self.dim}, bandwidth {self.bandwidth:.4g}"

    def arrays(self) -> dict[str, np.ndarray]:
        """What a saved model carries beside its weights: nothing, the seed draws the map."""
        return {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RandomFeatures | None:
        """The map a message's config (or a saved model) carries; None without one."""
        if "rf-inputs" not in config:
            return None
        return cls(str(config["rf-map"]), int(config["rf-inputs"]), int(config["rf-dim"]),
                   float(config["rf-bandwidth"]), int(config["rf-seed"]))

    @classmethod
    def from_saved(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
                   ) -> RandomFeatures | None:
        """The map a saved model carries (``meta``: results.json's record of it)."""
        return cls.from_config(meta)


@dataclass(frozen=True)
class RandomFeaturesRule:
    """How the identity round agrees on the random-feature map: the map's kind, width D and
    seed from the settings; its bandwidth given (``rf-bandwidth``) or, where None, from the
    nodes' per-feature sums as the nodes will scale their features (under
    ``standardize='node'`` the pooled std stands in for each node's own)."""

    kind: str
    dim: int
    bandwidth: float | None
    seed: int

    round_asks = 0  # no round of its own: the seed draws the map

    def agree(self, evidence: MapEvidence) -> tuple[RandomFeatures | None, str | None]:
        note = None
        bandwidth = self.bandwidth
        if bandwidth is None:
            stats = evidence.stats()
            if not stats:
                return None, None  # no node fits the run: the run stops on that
            bandwidth = bandwidth_from_stats(stats, evidence.scaling(stats)[1])
            note = (f"random-feature map {self.kind}, D={self.dim}, bandwidth {bandwidth:.4g} "
                    f"({BANDWIDTH_FACTOR:.1f} x the RMS distance between two training rows, "
                    f"from {len(stats)} node(s)' feature sums)")
        return RandomFeatures(self.kind, evidence.num_features, self.dim, float(bandwidth),
                              self.seed), note


@lru_cache(maxsize=4)
def _weights(kind: str, num_inputs: int, dim: int, bandwidth: float, seed: int
             ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64([int(seed), SEED_OFFSET]))
    w = rng.standard_normal((num_inputs, dim)) / bandwidth
    b = _OFFSETS[RandomMap(kind)](rng, dim)
    return w.astype(np.float32), b.astype(np.float32)


def bandwidth_from_stats(stats: list[tuple[int, np.ndarray, np.ndarray]],
                         scale: np.ndarray | None = None,
                         factor: float = BANDWIDTH_FACTOR) -> float:
    """``factor`` times the RMS distance between two of the pooled rows, from the nodes'
    per-feature sums only: ``E|x - x'|^2 = 2 sum_j var_j``, the variances of the features
    as the nodes scale them (``scale``: the per-feature std they are divided by).

    Split-invariant: the same rows give the same bandwidth however they are divided.
    """
    var = pooled_moments(stats)[1]
    if scale is not None:
        var = var / np.square(scale)
    spread = float(np.sqrt(2.0 * var.sum()))
    if spread <= 0:
        raise ValueError("the sites' features do not vary: no bandwidth can be derived for the "
                         "random-feature map; give rf-bandwidth")
    return factor * spread
