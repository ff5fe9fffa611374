"""Nyström features of the RBF kernel on landmarks the nodes summarize (``model='kernel'``).

``z(x) = [a x, K(x, L) P]`` with ``K(x, l) = exp(-|x - l|^2 / (2 s^2))`` on ``m`` landmarks
``L`` and ``P = sqrt(m) K(L, L)^{-1/2}`` (on the eigenvalues above a floor), so that the
kernel block's inner products approximate ``m`` times the kernel on the span of the
landmarks (Williams and Seeger 2001); ``a`` scales the rows (:func:`row_scale`). The rows themselves (``x``, already scaled as the run agreed) sit beside the
kernel features: the model class contains the logistic model, so the kernel model is never
a poorer class than the linear one on the user's data.

The landmarks are summaries, never rows: each node runs k-means on each class of its
training rows (:func:`class_centres`), its number of centres in proportion to its rows
(``m`` times its share of the run's rows), and sends the centres that are each the mean of
at least :data:`MIN_ROWS_PER_LANDMARK` rows. The server stacks them in the nodes' name order
and sends them with every later message; each node and the saved model compute ``P`` from
them (float64 ``eigh`` of an ``m``-square matrix, once per process and landmark set).

Everything downstream (Gram spaces, points, refinement, secure sums, node-side
verification) sees ``z(x)`` as the features: the convex protocol is unchanged.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gems_fl.data.feature_map import MapEvidence
from gems_fl.data.random_features import bandwidth_from_stats
from gems_fl.data.site_files import feature_stats

__all__ = ["MIN_ROWS_PER_LANDMARK", "KernelFeatures", "KernelRule", "LandmarkRound",
           "absorb_small_clusters",
           "class_centres",
           "landmark_quotas", "mean_square_norm", "row_scale"]

MIN_ROWS_PER_LANDMARK = 5  # a landmark is the mean of at least this many of a node's rows
EIGEN_FLOOR = 1e-6  # eigenvalues of K(L, L) below this times the largest are raised to it
#: k-means runs on a class's top principal directions where its rows have more columns: on
#: 5,000 Fashion-MNIST rows of one class into 250 clusters, 0.5 s against 1.7 s, and the
#: clusters' inertia on the whole rows 784,478 against 788,110 (the centres are the means of
#: the clusters' whole rows either way)
CLUSTER_DIRECTIONS = 64
CHUNK_ROWS = 2048  # rows mapped at once: bounds the (rows x m) temporaries
#: the last projection solved, by landmarks and width: in a simulation every node and the
#: server build the same map from the config, and its eigendecomposition costs seconds
_PROJECTIONS: dict[tuple[bytes, float], np.ndarray] = {}
MAP_NAME = "kernel"
LANDMARKS_KEY = "kernel-landmarks"  # config key: the landmarks, float32 bytes
DIGEST_KEY = "kernel-landmarks-sha256"  # config key: their hash, where a node keeps them


@dataclass(frozen=True)
class KernelFeatures:
    """One Nyström map: the landmarks ``(m, d)`` (float32, in the run's scaled units), the
    RBF width ``s``, and whether the rows sit beside the kernel features (``raw``)."""

    landmarks: np.ndarray
    bandwidth: float
    raw: bool = True
    raw_scale: float = 1.0  # the rows beside are multiplied by it (row_scale)
    #: where the landmarks came from, in words (the run plan and results.json say it)
    source: str = field(default="class centres the nodes sent", compare=False)
    _projection: list = field(default_factory=list, init=False, repr=False, compare=False)

    JSON_KEY = "feature_map"  # results.json's dataset record names the map by it
    #: the config keys of the map's large part (the landmarks) and of its hash: the first
    #: message of a run carries the part, a later one only its hash, and each node keeps
    #: the part between the two (:func:`gems_fl.protocol.map_round.with_kept_map_part`)
    LARGE_CONFIG = (LANDMARKS_KEY, DIGEST_KEY)

    def __post_init__(self) -> None:
        marks = np.ascontiguousarray(self.landmarks, dtype=np.float32)
        if marks.ndim != 2 or len(marks) < 1 or marks.shape[1] < 1:
            raise ValueError(f"the kernel map needs landmarks as a non-empty (m, d) array, got "
                             f"shape {marks.shape}")
        if not np.all(np.isfinite(marks)):
            raise ValueError("the kernel map's landmarks hold NaN or infinite values")
        if not np.isfinite(self.bandwidth) or self.bandwidth <= 0:
            raise ValueError(f"rf-bandwidth={self.bandwidth!r} must be a positive number")
        if not np.isfinite(self.raw_scale) or self.raw_scale <= 0:
            raise ValueError(f"the kernel map's raw_scale={self.raw_scale!r} must be positive")
        marks.flags.writeable = False
        object.__setattr__(self, "landmarks", marks)

    @property
    def num_landmarks(self) -> int:
        return int(self.landmarks.shape[0])

    @property
    def num_inputs(self) -> int:
        return int(self.landmarks.shape[1])

    @property
    def dim(self) -> int:
        """The width of ``z(x)``: the landmarks' count, plus the inputs when ``raw``."""
        return self.num_landmarks + (self.num_inputs if self.raw else 0)

    @property
    def raw_columns(self) -> int:
        """How many of ``z(x)``'s leading columns are the rows themselves."""
        return self.num_inputs if self.raw else 0

    def describe(self) -> str:
        """The map in words, for the run plan."""
        return (f"{self.num_landmarks} landmarks: {self.source}; "
                f"{'the rows beside, ' if self.raw else ''}D={self.dim}, RBF width {self.bandwidth:.4g}")

    def digest(self) -> str:
        """A short hash of the landmarks (results and logs name the set by it)."""
        return hashlib.sha256(self.landmarks.tobytes()).hexdigest()[:16]

    def projection(self) -> np.ndarray:
        """``P = sqrt(m) K(L, L)^{-1/2}`` as float32 ``(m, m)``, computed once."""
        if not self._projection:
            key = (self.landmarks.tobytes(), float(self.bandwidth))
            if key not in _PROJECTIONS:  # the nodes of one process share the map
                _PROJECTIONS.clear()
                _PROJECTIONS[key] = self._solve_projection()
            self._projection.append(_PROJECTIONS[key])
        return self._projection[0]

    def _solve_projection(self) -> np.ndarray:
        gram = self._kernel(self.landmarks.astype(np.float64), self.landmarks.astype(np.float64))
        values, vectors = np.linalg.eigh(gram)
        values = np.maximum(values, EIGEN_FLOOR * max(float(values[-1]), 1e-300))
        # sqrt(m): a kernel feature's mean square about 1, as a scaled row feature's
        scale = np.sqrt(self.num_landmarks / values)
        out = (vectors * scale).astype(np.float32)
        out.flags.writeable = False
        return out

    def _kernel(self, x: np.ndarray, marks: np.ndarray) -> np.ndarray:
        sq = (np.einsum("ij,ij->i", x, x)[:, None] + np.einsum("ij,ij->i", marks, marks)[None, :]
              - 2.0 * (x @ marks.T))
        np.maximum(sq, 0.0, out=sq)
        sq *= -0.5 / (self.bandwidth ** 2)
        return np.exp(sq, out=sq)

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``z(x)`` of shape ``(n, dim)``, float32."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.num_inputs:
            raise ValueError(f"the kernel map takes {self.num_inputs} features, got an array of "
                             f"shape {x.shape}")
        proj = self.projection()
        out = np.empty((len(x), self.dim), dtype=np.float32)
        start_k = self.num_inputs if self.raw else 0
        if self.raw:
            out[:, :self.num_inputs] = x * np.float32(self.raw_scale)
        for start in range(0, len(x), CHUNK_ROWS):
            part = self._kernel(x[start:start + CHUNK_ROWS], self.landmarks)
            out[start:start + CHUNK_ROWS, start_k:] = part @ proj
        return out

    def to_config(self, whole: bool = True) -> dict[str, Any]:
        """The map as message config keys: the landmarks as float32 bytes, or (``whole``
        False) only their hash, for a node that keeps them from an earlier message of the
        run (:data:`LARGE_CONFIG`)."""
        held = ({LANDMARKS_KEY: self.landmarks.tobytes()} if whole
                else {DIGEST_KEY: self.digest()})
        return {"feature-map": MAP_NAME, **held,
                "kernel-shape": [self.num_landmarks, self.num_inputs],
                "rf-bandwidth": float(self.bandwidth), "kernel-raw": bool(self.raw),
                "kernel-raw-scale": float(self.raw_scale)}

    def to_json(self) -> dict[str, Any]:
        """What results.json records (the landmarks themselves travel in the model file)."""
        return {"feature-map": MAP_NAME, "landmarks": self.num_landmarks,
                "inputs": self.num_inputs, "dim": self.dim, "rf-bandwidth": float(self.bandwidth),
                "raw": bool(self.raw), "raw-scale": float(self.raw_scale),
                "landmarks-sha256": self.digest(), "landmarks-from": self.source}

    def arrays(self) -> dict[str, np.ndarray]:
        """What a saved model carries beside its weights."""
        return {"feature-map.landmarks": self.landmarks}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> KernelFeatures | None:
        """The map a message's config carries; None without one."""
        if config.get("feature-map") != MAP_NAME:
            return None
        m, d = (int(v) for v in config["kernel-shape"])
        if LANDMARKS_KEY not in config:
            raise ValueError("the message names the kernel map's landmarks by their hash "
                             f"({config.get(DIGEST_KEY)}) but carries none")
        marks = np.frombuffer(bytes(config[LANDMARKS_KEY]), dtype=np.float32)
        if marks.size != m * d:
            raise ValueError(f"the kernel map's landmarks hold {marks.size} numbers, not {m} x {d}")
        return cls(marks.reshape(m, d), float(config["rf-bandwidth"]), bool(config["kernel-raw"]),
                   float(config.get("kernel-raw-scale", 1.0)))

    @classmethod
    def from_saved(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
                   ) -> KernelFeatures | None:
        """The map a saved model carries (``meta``: results.json's record of it)."""
        if meta.get("feature-map") != MAP_NAME:
            return None
        if "feature-map.landmarks" not in arrays:
            raise ValueError("the model file lacks the kernel map's landmarks "
                             "('feature-map.landmarks')")
        out = cls(np.asarray(arrays["feature-map.landmarks"]), float(meta["rf-bandwidth"]),
                  bool(meta.get("raw", True)), float(meta.get("raw-scale", 1.0)))
        if meta.get("landmarks-sha256") and meta["landmarks-sha256"] != out.digest():
            raise ValueError("the model file's landmarks differ from those its results record "
                             "(landmarks-sha256): the two files are from different runs")
        return out


def row_scale(mean_square_norm: float, num_inputs: int) -> float:
    """The factor on the rows beside the kernel features: ``sqrt(d / E|x|^2)``, so that a
    row feature's mean square is 1 on average, as a kernel feature's about is (the kernel
    block is scaled by ``sqrt(m)``: its rows have norm at most ``sqrt(m)``). Both blocks
    then weigh alike in the Gram statistics: unscaled rows of many features would fill the
    top of their spectrum (a rank-r factor would leave the kernel block to its diagonal)
    and the LDA shrinkage, relative to the trace, would smother the kernel block; and the
    pooled ridges, absolute, mean what they mean for standardised rows."""
    if mean_square_norm <= 0:
        return 1.0
    return float(np.sqrt(num_inputs / mean_square_norm))


def mean_square_norm(stats: list[tuple[int, np.ndarray, np.ndarray]], mean: np.ndarray | None,
                     std: np.ndarray | None) -> float:
    """``E|x|^2`` of the pooled rows as the nodes scale them (``(x - mean) / std``; None:
    unscaled), from their per-feature sums only."""
    from gems_fl.data.site_files import pooled_moments

    centre, var = pooled_moments(stats)
    if mean is not None:
        centre = centre - mean
    if std is not None:
        centre, var = centre / std, var / np.square(std)
    return float(np.sum(var + np.square(centre)))


def landmark_quotas(labels: np.ndarray, share: float, min_rows: int = MIN_ROWS_PER_LANDMARK
                    ) -> dict[int, int]:
    """``{class: number of centres}`` for a node: ``share`` (the run's landmarks per training
    row) times the class's rows, rounded, at most one per ``min_rows`` rows."""
    classes, counts = np.unique(np.asarray(labels), return_counts=True)
    return {int(c): min(int(round(n * share)), int(n) // min_rows)
            for c, n in zip(classes, counts)}


def absorb_small_clusters(rows: np.ndarray, labels: np.ndarray, k: int, min_rows: int
                          ) -> np.ndarray:
    """Cluster labels with every cluster under ``min_rows`` rows dissolved into the
    others, smallest first (ties: the lower number), each of its rows to the nearest
    remaining cluster mean, the means kept up to date.

    For a class asked for more landmarks than one per ``min_rows`` rows (a table of at most
    ``min_rows`` times the landmarks asked, 20,000 rows at the default 4,000), capped at
    that, k-means is asked for clusters of ``min_rows`` rows on average and
    leaves most of them under the floor: dropped with their rows, they kept about one
    landmark per 12 rows. Dissolving them keeps their rows in the landmarks and
    lets more clusters reach the floor: on tables of 452 to 8,016 rows 12-20 % more
    landmarks, and the kernel model's validation accuracy the same or higher
    (results/benchmarks/landmarks.json). A cluster is dissolved only while another remains.
    """
    labels = np.asarray(labels).copy()
    counts = np.bincount(labels, minlength=k).astype(np.int64)
    sums = np.zeros((k, rows.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, rows.astype(np.float64))
    alive = counts > 0
    while alive.sum() > 1:
        small = np.flatnonzero(alive & (counts < min_rows))
        if not len(small):
            break
        j = int(small[np.argmin(counts[small])])
        alive[j] = False
        others = np.flatnonzero(alive)
        for i in np.flatnonzero(labels == j):
            means = sums[others] / counts[others, None]
            target = int(others[np.argmin(((means - rows[i]) ** 2).sum(axis=1))])
            labels[i] = target
            counts[target] += 1
            sums[target] += rows[i]
        counts[j], sums[j] = 0, 0.0
    return labels


def principal_coordinates(rows: np.ndarray, directions: int = CLUSTER_DIRECTIONS
                          ) -> np.ndarray:
    """``rows`` (float64) on their own top ``directions`` principal directions (centred),
    or the rows themselves where they have no more columns than that."""
    if rows.shape[1] <= directions or len(rows) < 2:
        return rows
    from scipy.linalg import eigh

    centred = rows - rows.mean(axis=0)
    d = rows.shape[1]
    _, vectors = eigh(centred.T @ centred, subset_by_index=[d - directions, d - 1],
                      check_finite=False)
    return centred @ vectors


def class_centres(x: np.ndarray, y: np.ndarray, share: float, seed: int,
                  min_rows: int = MIN_ROWS_PER_LANDMARK) -> tuple[np.ndarray, np.ndarray]:
    """A node's landmarks: k-means centres of each class's rows (``share`` centres per row,
    clustered on :func:`principal_coordinates`, each centre the mean of its whole rows;
    :func:`landmark_quotas`), keeping those that are each the mean of at least ``min_rows``
    rows. Returns ``(centres (k, d) float32, rows per centre (k,))``, classes in order."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y)
    centres, sizes = [], []
    for label, k in landmark_quotas(y, share, min_rows).items():
        if k < 1:
            continue
        # float64: sklearn's k-means++ upcasts float32 distances chunk by chunk, twice the time
        rows = x[y == label].astype(np.float64)
        with warnings.catch_warnings():  # repeated rows: fewer distinct clusters, dropped below
            warnings.simplefilter("ignore", ConvergenceWarning)
            fit = KMeans(n_clusters=k, n_init=1, max_iter=100,
                         random_state=seed).fit(principal_coordinates(rows))
        labels = fit.labels_
        if int(round(len(rows) * share)) > k:  # asked more than its rows allow: capped
            labels = absorb_small_clusters(rows, labels, k, min_rows)
        counts = np.bincount(labels, minlength=k)
        keep = counts >= min_rows
        # the mean of each kept cluster's own rows: exactly what the centre claims to be
        means = np.stack([rows[labels == j].mean(axis=0) for j in np.flatnonzero(keep)]) \
            if keep.any() else np.zeros((0, x.shape[1]), np.float32)
        centres.append(means.astype(np.float32))
        sizes.append(counts[keep])
    if not centres:
        return np.zeros((0, x.shape[1]), np.float32), np.zeros(0, np.int64)
    return np.concatenate(centres), np.concatenate(sizes).astype(np.int64)


@dataclass(frozen=True)
class KernelRule:
    """How the identity round agrees on the Nyström map: ``landmarks`` asked of the nodes in
    the landmark round (their class centres, stacked in the nodes' name order), the RBF
    width given (``rf-bandwidth``) or, where None, from the nodes' per-feature sums as for
    random features, and the rows beside scaled to unit RMS norm (:func:`row_scale`).
    Where the run builds the map from the server's public rows (``dp-epsilon``), no node's
    summary enters it."""

    landmarks: int
    bandwidth: float | None
    seed: int

    @property
    def round_asks(self) -> int:
        return int(self.landmarks)

    def agree(self, evidence: MapEvidence) -> tuple[KernelFeatures | None, str | None]:
        if evidence.public_rows is not None:
            return self._from_public_rows(evidence) if evidence.nodes else (None, None)
        sent = tuple(n for n in evidence.nodes if n.sent is not None and len(n.sent))
        stats = evidence.stats(sent)
        if not sent or not stats:
            return None, None  # before the landmark round (no centres yet)
        mean, std = evidence.scaling(stats)
        bandwidth = self.bandwidth if self.bandwidth is not None else bandwidth_from_stats(stats, std)
        marks = np.concatenate([n.sent for n in sent])
        scale = row_scale(mean_square_norm(stats, mean, std), marks.shape[1])
        note = (f"kernel map on {len(marks)} landmarks from {len(sent)} node(s), "
                f"D={len(marks) + marks.shape[1]} (the rows and the kernel features), "
                f"RBF width {bandwidth:.4g}")
        return KernelFeatures(marks, float(bandwidth), raw_scale=scale), note

    def _from_public_rows(self, evidence: MapEvidence) -> tuple[KernelFeatures, str]:
        """The map from the server's own public rows: the rows themselves as landmarks where
        they are no more than asked, else k-means centres of each class's rows; the RBF
        width and the rows' scale from the same rows. Nothing a node holds enters the map,
        so no privacy budget is spent on it."""
        rows, labels = evidence.public_rows()
        rows = np.asarray(rows, dtype=np.float32)
        if rows.ndim != 2 or len(rows) < 2 or rows.shape[1] != evidence.num_features:
            raise ValueError(f"model='kernel' under dp-epsilon takes its landmarks from the "
                             f"server's public rows, and it holds {len(rows)} of shape "
                             f"{rows.shape}; give the server at least 2 rows of "
                             f"{evidence.num_features} features (public-samples in a "
                             "simulation, public-data otherwise)")
        marks = rows if len(rows) <= self.landmarks else class_centres(
            rows, np.asarray(labels), self.landmarks / len(rows), self.seed, min_rows=1)[0]
        stats = [feature_stats(rows)]  # already scaled as the nodes scale theirs
        bandwidth = self.bandwidth if self.bandwidth is not None else bandwidth_from_stats(stats)
        scale = row_scale(mean_square_norm(stats, None, None), marks.shape[1])
        note = (f"kernel map on {len(marks)} landmarks from the server's {len(rows)} public "
                f"rows, D={len(marks) + marks.shape[1]} (the rows and the kernel features), "
                f"RBF width {bandwidth:.4g}")
        return KernelFeatures(marks, float(bandwidth), raw_scale=scale,
                              source="the server's public rows"), note


class LandmarkRound:
    """The kernel model's own round: each node sends k-means centres of each class of its
    (scaled) training rows (:func:`class_centres`), in proportion to its rows, each the mean
    of at least :data:`MIN_ROWS_PER_LANDMARK` of them; they become the map's landmarks."""

    def summarize(self, x_train: np.ndarray, y_train: np.ndarray, share: float,
                  seed: int) -> dict[str, np.ndarray]:
        centres, sizes = class_centres(x_train, y_train, share, seed)
        return {"centres": np.ascontiguousarray(centres, dtype=np.float32),
                "sizes": np.ascontiguousarray(sizes, dtype=np.int64)}

    def check(self, arrays: Mapping[str, np.ndarray], num_features: int,
              most: int) -> np.ndarray:
        if "centres" not in arrays or "sizes" not in arrays:
            raise ValueError(f"the landmark reply lacks 'centres' and 'sizes' (it holds "
                             f"{sorted(arrays)})")
        centres, sizes = np.asarray(arrays["centres"]), np.asarray(arrays["sizes"])
        if centres.ndim != 2 or centres.shape[1] != num_features or sizes.shape != (len(centres),):
            raise ValueError(f"landmark reply has centres of shape {centres.shape} and sizes of "
                             f"shape {sizes.shape}; the run has {num_features} features")
        if not np.all(np.isfinite(centres)):
            raise ValueError("landmark reply holds NaN or infinite values")
        if len(sizes) and int(sizes.min()) < MIN_ROWS_PER_LANDMARK:
            raise ValueError(f"landmark reply has a centre of {int(sizes.min())} row(s); each "
                             f"must be the mean of at least {MIN_ROWS_PER_LANDMARK}")
        if len(centres) > most:
            raise ValueError(f"landmark reply has {len(centres)} centres; the node's share "
                             f"allows at most {most}")
        return centres.astype(np.float32)

    def report(self, kept: int, asked: int, rows: int) -> dict[str, Any]:
        return {"landmarks": int(kept), "asked": int(asked),
                "why": landmark_count_reason(kept, asked, rows)}

    def describe(self, kept: int, nodes: int) -> str:
        return (f"{kept} class centres from {nodes} node(s) (each the mean of at least "
                f"{MIN_ROWS_PER_LANDMARK} rows)")


def landmark_count_reason(kept: int, asked: int, rows: int) -> str:
    """Why a run has ``kept`` landmarks when ``asked`` were asked of ``rows`` training rows
    (results.json: ``identify.map_round.why``)."""
    rule = (f"each a k-means centre of one class at one site, the mean of at least "
            f"{MIN_ROWS_PER_LANDMARK} of its rows")
    if kept >= asked:
        return f"{kept} as asked, {rule}"
    if asked * MIN_ROWS_PER_LANDMARK > rows:
        return (f"{kept} of {asked} asked: {rows} training rows allow at most one per "
                f"{MIN_ROWS_PER_LANDMARK} rows of a class ({rule}; clusters under that "
                "dissolved into the others)")
    return f"{kept} of {asked} asked: {rule}; clusters under that were dropped"
