"""Running sums of the nodes' Gram statistics: what the server keeps instead of every
node's matrix when there are many nodes (``server-grams=sums``).

The closed-form center, the pooled ridge classifier and the pooled LDA point need only

    S_G = sum_k n_k G_k,   S_WG = sum_k n_k W_k G_k,   S_M = sum_k n_k M_k,
    N = sum_k n_k,         per-class counts,

so the server adds each reply in as it is decoded and drops the node's matrix: memory
stays at three ``(n, n)``-or-smaller arrays whatever the number of nodes. The sums are
kept in fixed point (int64, ``2**-FRACTION_BITS`` units): integer addition is exact and
associative, so the sums, and every point solved from them, do not depend on the order
in which replies arrive. Membership of ``h_G`` in one node's space needs that node's
``G_k``, so with sums each node checks it on its own data (the evaluate round,
:func:`gems_fl.protocol.verify.score_models`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from gems_fl.geometry.gram import FactoredGram
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.linalg import symmetrize_
from gems_fl.geometry.virtual import class_statistics

#: Fixed-point resolution of the sums: 2**-30 (about 1e-9) of one unit of ``n_k G_k``.
FRACTION_BITS = 30
#: The largest magnitude a sum may reach: int64 holds 2**63, kept two bits of head room.
_LIMIT = 2.0 ** (62 - FRACTION_BITS)


def _fixed(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` as fixed-point int64 (``FRACTION_BITS`` fraction bits), checked.

    ``values`` is scaled and rounded in place: every caller passes a product of its own.
    The plain expression made four temporaries of its size, 145 MB each for a kernel
    model's reply at D = 4,252, for every reply the server folds in."""
    return _rounded(name, values).astype(np.int64)


def _rounded(name: str, values: np.ndarray) -> np.ndarray:
    """:func:`_fixed`'s integers still as float64 (scaled and rounded in place, checked):
    :func:`_add_rounded` folds them in a block of rows at a time, so no int64 copy of a
    node's whole matrix is made."""
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} holds NaN or infinite entries")
    peak = max(float(values.max()), -float(values.min())) if values.size else 0.0
    if peak >= _LIMIT:
        raise ValueError(f"{name} has an entry of magnitude {peak:.3g}, "
                         f"beyond what the fixed-point sums hold ({_LIMIT:.3g}); standardise "
                         "the features or run with server-grams=nodes")
    np.ldexp(values, FRACTION_BITS, out=values)
    return np.rint(values, out=values)


def _add_rounded(total: np.ndarray, rounded: np.ndarray, rows: int = 256) -> None:
    """``total += rounded`` as int64 (the integers :func:`_fixed` makes), ``rows`` rows at
    a time."""
    for start in range(0, len(total), rows):
        total[start:start + rows] += rounded[start:start + rows].astype(np.int64)


def _float(values: np.ndarray) -> np.ndarray:
    return np.ldexp(values.astype(np.float64), -FRACTION_BITS)


class GramSums:
    """Sums over nodes of ``n_k G_k``, ``n_k W_k G_k`` and (with label moments)
    ``n_k M_k`` and the class counts, for a linear layer of shape ``(C, n)``.

    Parameters
    ----------
    num_classes : int
        ``C``, the rows of every center.
    size : int
        ``n``, the layer's inputs plus the bias.
    """

    def __init__(self, num_classes: int, size: int) -> None:
        if num_classes < 1 or size < 1:
            raise ValueError(f"need num_classes >= 1 and size >= 1; got {num_classes}, {size}")
        self.num_classes, self.size = int(num_classes), int(size)
        self.nodes = 0
        self.count = 0
        self._gram = np.zeros((size, size), dtype=np.int64)
        self._center_gram = np.zeros((num_classes, size), dtype=np.int64)
        self._moments = np.zeros((num_classes, size), dtype=np.int64)
        self.class_counts = np.zeros(num_classes, dtype=np.int64)
        self._with_labels: bool | None = None
        self._with_centers = True
        self._class_grams: np.ndarray | None = None  # sum over nodes of count_kc S_kc
        self._with_class_grams: bool | None = None
        # the kernel model: the same sums for the layer's leading columns (the rows)
        self._column_class_grams: np.ndarray | None = None
        self._with_column_class_grams: bool | None = None

    def add(self, num_train: int, center: np.ndarray, gram: np.ndarray,
            moments: np.ndarray | None = None, class_counts: np.ndarray | None = None,
            class_grams: np.ndarray | None = None, *,
            column_class_grams: np.ndarray | None = None) -> None:
        """Add one node: its row count, center ``W_k`` ``(C, n)``, Gram matrix ``G_k``
        (a mean over its rows), and optionally label moments ``M_k`` ``(C, n)`` with class
        counts ``(C,)``, its class Gram matrices ``(m, n, n)`` (one per class it holds)
        and (the kernel model) those of its first ``k`` inputs ``(m, k + 1, k + 1)``:
        each every node's or none. Nothing is added when a check fails."""
        n_k = int(num_train)
        if n_k <= 0:
            raise ValueError(f"num_train must be a positive count; got {num_train}")
        w = np.asarray(center, dtype=np.float64).reshape(self.num_classes, -1)
        g = np.asarray(gram, dtype=np.float64)
        if w.shape != (self.num_classes, self.size) or g.shape != (self.size, self.size):
            raise ValueError(f"center {w.shape} and gram {g.shape} do not fit the layer "
                             f"({self.num_classes}, {self.size})")
        if self.nodes and not self._with_centers:
            raise ValueError("noised releases and plain replies cannot share one sum")
        labels = moments is not None
        if self._with_labels is not None and labels != self._with_labels:
            raise ValueError("every node adds label moments, or none does")
        # G sent as its factor is formed just above, ours to scale where it lies: 145 MB
        # less for each kernel reply folded in (D = 4,252)
        scaled = np.multiply(g, n_k, out=g) if isinstance(gram, FactoredGram) else n_k * g
        center_part = w @ scaled  # before _fixed rounds ``scaled`` in place
        parts = [_rounded("n_k G_k", scaled), _fixed("n_k W_k G_k", center_part)]
        counts = None
        if labels:  # the class counts, and n_k M_k among the parts
            counts = self._label_sum(n_k, moments, class_counts, parts)
        grams = self._class_sum("class Gram matrices", class_grams, counts,
                                self._with_class_grams, self.size)
        known = None if self._column_class_grams is None else self._column_class_grams.shape[1]
        columns = self._class_sum("its columns' class Gram matrices", column_class_grams, counts,
                                  self._with_column_class_grams, known)
        self._accumulate(n_k, parts, counts, grams, columns)

    def _accumulate(self, n_k: int, parts: list[np.ndarray], counts: np.ndarray | None,
                    grams: tuple | None, columns: tuple | None) -> None:
        """Add one node's checked fixed-point parts (``counts`` None: no label moments;
        the Gram matrix's still float64, :func:`_rounded`)."""
        _add_rounded(self._gram, parts[0])
        self._center_gram += parts[1]
        if counts is not None:
            self._moments += parts[2]
            self.class_counts += counts
        if grams is not None:
            if self._class_grams is None:
                self._class_grams = np.zeros((self.num_classes, self.size, self.size), np.int64)
            self._class_grams[grams[0]] += grams[1]
        if columns is not None:
            if self._column_class_grams is None:
                self._column_class_grams = np.zeros((self.num_classes, *columns[1].shape[1:]),
                                                    np.int64)
            self._column_class_grams[columns[0]] += columns[1]
        self._with_labels = counts is not None
        self._with_class_grams = grams is not None
        self._with_column_class_grams = columns is not None
        self.nodes += 1
        self.count += n_k

    def _label_sum(self, n_k: int, moments: np.ndarray, class_counts: np.ndarray,
                   parts: list[np.ndarray]) -> np.ndarray:
        """One node's class counts, checked against the layer; ``n_k M_k`` joins ``parts``."""
        m = np.asarray(moments, dtype=np.float64)
        counts = np.asarray(class_counts, dtype=np.int64)
        if m.shape != (self.num_classes, self.size) or counts.shape != (self.num_classes,):
            raise ValueError(f"label moments {m.shape} or class counts {counts.shape} do "
                             f"not fit the layer ({self.num_classes}, {self.size})")
        parts.append(_fixed("n_k M_k", n_k * m))
        return counts

    def _class_sum(self, what: str, per_class: np.ndarray | None, counts: np.ndarray | None,
                   before: bool | None, size: int | None) -> tuple[np.ndarray, np.ndarray] | None:
        """One node's ``(held classes, sum count_kc S_kc)`` of ``per_class`` ``(m, s, s)``,
        checked (every node's or none; with label moments; one matrix per class with rows;
        ``s`` the ``size`` the sums hold, or at most the layer's); None where not given."""
        if per_class is None:
            if before:
                raise ValueError(f"every node adds {what}, or none does")
            return None
        if counts is None:
            raise ValueError(f"{what} come with label moments and class counts")
        if before is False:
            raise ValueError(f"every node adds {what}, or none does")
        held = np.flatnonzero(counts > 0)
        matrices = np.asarray(per_class, dtype=np.float64)
        if matrices.ndim != 3 or matrices.shape[0] != len(held) or \
                matrices.shape[1] != matrices.shape[2] or matrices.shape[1] > self.size or \
                (size is not None and matrices.shape[1] != size):
            raise ValueError(f"{what} {matrices.shape} do not fit the node's {len(held)} "
                             f"classes with rows and the size {size or self.size}")
        return held, _fixed(f"count_kc S_kc ({what})", counts[held, None, None] * matrices)

    @classmethod
    def from_means(cls, count: int, nodes: int, gram: np.ndarray, center_gram: np.ndarray,
                   moments: np.ndarray, class_shares: np.ndarray,
                   class_grams: np.ndarray | None = None) -> GramSums:
        """The sums over ``nodes`` nodes and ``count`` training rows, given as their
        ``n_k``-weighted means (what secure aggregation returns): ``sum n_k G_k / N`` and
        so on, with the class shares ``sum counts / N`` and optionally the class Gram
        matrices ``sum_k count_kc S_kc / N`` ``(C, n, n)``."""
        c, n = np.shape(center_gram)
        sums = cls(c, n)
        if np.shape(gram) != (n, n) or np.shape(moments) != (c, n) or np.shape(class_shares) != (c,):
            raise ValueError(f"means of shapes {np.shape(gram)}, {np.shape(moments)}, "
                             f"{np.shape(class_shares)} do not fit the layer ({c}, {n})")
        count = int(count)
        sums._gram = _fixed("sum n_k G_k", count * np.asarray(gram, dtype=np.float64))
        sums._center_gram = _fixed("sum n_k W_k G_k", count * np.asarray(center_gram,
                                                                         dtype=np.float64))
        sums._moments = _fixed("sum n_k M_k", count * np.asarray(moments, dtype=np.float64))
        sums.class_counts = np.rint(np.asarray(class_shares) * count).astype(np.int64)
        sums._with_labels, sums.nodes, sums.count = True, int(nodes), count
        if class_grams is not None:
            if np.shape(class_grams) != (c, n, n):
                raise ValueError(f"class Gram means of shape {np.shape(class_grams)} do not fit "
                                 f"the layer ({c}, {n}, {n})")
            sums._class_grams = _fixed("sum count_kc S_kc",
                                       count * np.asarray(class_grams, dtype=np.float64))
            sums._with_class_grams = True
        return sums

    def add_noised(self, num_train: int, gram_sum: np.ndarray, moments_sum: np.ndarray) -> None:
        """Add one node's differentially private release (:mod:`gems_fl.geometry.dp`):
        ``S_G`` ``(n, n)`` and ``S_M`` ``(C, n)``, sums over its ``num_train`` clipped
        training rows plus noise. There is no ``W_k G_k`` (these sums then give no
        closed-form point); the class counts are the moments' bias column, rounded and
        floored at 0 (the noise reaches them too). Nothing is added when a check fails."""
        n_k = int(num_train)
        if n_k <= 0:
            raise ValueError(f"num_train must be a positive count; got {num_train}")
        g = np.asarray(gram_sum, dtype=np.float64)
        m = np.asarray(moments_sum, dtype=np.float64)
        if g.shape != (self.size, self.size) or m.shape != (self.num_classes, self.size):
            raise ValueError(f"Gram sum {g.shape} and moments {m.shape} do not fit the layer "
                             f"({self.num_classes}, {self.size})")
        if self.nodes and self._with_centers:
            raise ValueError("noised releases and plain replies cannot share one sum")
        parts = _fixed("S_G", 0.5 * (g + g.T)), _fixed("S_M", m.copy())
        self._gram += parts[0]
        self._moments += parts[1]
        self.class_counts += np.maximum(np.rint(m[:, -1]), 0).astype(np.int64)
        self._with_labels, self._with_centers = True, False
        self.nodes += 1
        self.count += n_k

    @classmethod
    def from_noised(cls, count: int, nodes: int, gram_sum: np.ndarray,
                    moments_sum: np.ndarray) -> GramSums:
        """The sums of ``nodes`` nodes' differentially private releases over ``count``
        training rows, given already summed (secure aggregation returns them)."""
        c, n = np.shape(moments_sum)
        sums = cls(c, n)
        sums.add_noised(count, gram_sum, moments_sum)
        sums.nodes = int(nodes)
        return sums

    @property
    def has_centers(self) -> bool:
        """Whether the sums hold ``sum n_k W_k G_k`` (not under differential privacy)."""
        return self._with_centers

    @property
    def has_labels(self) -> bool:
        return bool(self._with_labels)

    @property
    def has_class_grams(self) -> bool:
        """Whether every node added its class Gram matrices (the ``gaussian`` point)."""
        return bool(self._with_class_grams) and self._class_grams is not None

    def class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each class's row count, mean and covariance over all nodes, as
        :func:`gems_fl.geometry.virtual.pooled_class_moments` returns them."""
        self._check()
        if not self.has_class_grams:
            raise ValueError("the nodes sent no class Gram matrices (class-grams)")
        counts = self.class_counts.astype(np.float64)
        seen = counts > 0
        second = np.zeros((self.num_classes, self.size, self.size))
        second[seen] = _float(self._class_grams[seen]) / counts[seen, None, None]
        return counts, *class_statistics(second)

    @property
    def has_column_class_grams(self) -> bool:
        """Whether every node added its leading columns' class Gram matrices."""
        return bool(self._with_column_class_grams) and self._column_class_grams is not None

    def column_class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`class_moments` on the layer's leading columns (the kernel model's rows)."""
        self._check()
        if not self.has_column_class_grams:
            raise ValueError("the nodes sent no class Gram matrices of their columns")
        counts = self.class_counts.astype(np.float64)
        seen = counts > 0
        k = self._column_class_grams.shape[1]
        second = np.zeros((self.num_classes, k, k))
        second[seen] = _float(self._column_class_grams[seen]) / counts[seen, None, None]
        return counts, *class_statistics(second)

    def _check(self) -> None:
        if self.nodes == 0:
            raise ValueError("no node added yet")

    def pooled_gram(self) -> np.ndarray:
        """``sum_k (n_k / N) G_k``, float64 ``(n, n)``, symmetric."""
        self._check()
        g = self._gram.astype(np.float64)
        np.ldexp(g, -FRACTION_BITS, out=g)
        g /= self.count
        return symmetrize_(g)

    def pooled_moments(self) -> np.ndarray:
        """``sum_k (n_k / N) M_k``, float64 ``(C, n)``."""
        self._check()
        if not self.has_labels:
            raise ValueError("the nodes sent no label moments (label-moments=false)")
        return _float(self._moments) / self.count

    def center_system(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sum n_k G_k, sum n_k W_k G_k) / N``, float64 torch, the first symmetric: what
        the closed-form center solves (:func:`gems_fl.geometry.gram_merge.center_system`)."""
        if not self.has_centers:
            raise ValueError("the closed-form point needs sum n_k W_k G_k, which noised "
                             "(dp-epsilon) sums do not hold; use the pooled or LDA point")
        return (torch.as_tensor(self.pooled_gram()),
                torch.as_tensor(_float(self._center_gram) / self.count))

    @property
    def nbytes(self) -> int:
        """Bytes the sums occupy, whatever the number of nodes."""
        return int(self._gram.nbytes + self._center_gram.nbytes + self._moments.nbytes
                   + self.class_counts.nbytes
                   + (0 if self._class_grams is None else self._class_grams.nbytes)
                   + (0 if self._column_class_grams is None else self._column_class_grams.nbytes))


def summed_result(spaces: Sequence, point: np.ndarray, method: str,
                  details: dict) -> IntersectionResult:
    """``point`` as ``h_G`` when the server holds only sums: membership in each space is
    not known on the server (``inside`` and ``miss`` None per node) until the nodes report
    it (:func:`complete_membership`)."""
    k = len(spaces)
    details = {**details, "membership": "checked by each node on its own data (the server "
               "holds only the sums of the Gram statistics)",
               "certified_radius": [float(s.certified_radius) for s in spaces]}
    return IntersectionResult(point=np.asarray(point, dtype=np.float64).reshape(-1),
                              found=False, method=method, objective=math.nan,
                              inside=[None] * k, miss=[None] * k, iterations=0,
                              details=details)


def complete_membership(result: IntersectionResult, spaces: Sequence,
                        reports: Sequence[dict | None]) -> IntersectionResult:
    """``result`` with each node's own membership check filled in: ``reports[k]`` holds
    node ``k``'s ``distance`` (its Gram distance from ``h_G``, measured on its data) and
    ``inside``; None where the node did not answer (membership then stays unknown)."""
    inside, miss, distance, certified_inside = [], [], [], []
    for space, report in zip(spaces, reports):
        if report is None:
            inside.append(None), miss.append(None), distance.append(None)
            certified_inside.append(None)
            continue
        d = float(report["distance"])
        inside.append(bool(report["inside"]))
        miss.append(0.0 if report["inside"] else max(d - space.radius, 0.0))
        distance.append(d)
        certified_inside.append(d < space.certified_radius)
    known = [m for m in miss if m is not None]
    details = {**result.details, "distance": distance, "inside_certified": certified_inside}
    return IntersectionResult(
        point=result.point, found=all(v is True for v in inside), method=result.method,
        objective=float(sum(known)) if len(known) == len(miss) else math.nan,
        inside=inside, miss=miss, iterations=result.iterations, details=details)
