"""Label divisions over nodes (the GEMS paper's appendix table) and index partitioning.

A *division* is a list with one entry per node, each the sorted list of class
labels that node holds. Samples of a class are shared out among the nodes that
hold it without repetition, so no sample is ever given to two nodes. A Dirichlet
division (:class:`gems_fl.data.dirichlet.DirichletDivision`) instead draws each class's
shares over the nodes; :func:`node_data` and :func:`check_partition_sizes` take both.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from gems_fl.data.datasets import DatasetSplits
from gems_fl.data.dirichlet import DirichletDivision, dirichlet_shares, parse_dirichlet, pool_rows

PAPER_DIVISIONS: dict[int, list[list[int]]] = {
    2: [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]],
    3: [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]],
    5: [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]],
}
PAPER_NUM_CLASSES = 10
# HAM10000 (7 classes): for K=5, labels 0-4 each on its own node and labels 5 and 6
# shared by all five nodes (their samples are split evenly, no sample twice).
HAM10000_PAPER_DIVISIONS: dict[int, list[list[int]]] = {
    2: [[0, 1, 2, 3], [4, 5, 6]],
    3: [[0, 1], [2, 3], [4, 5, 6]],
    5: [[0, 5, 6], [1, 5, 6], [2, 5, 6], [3, 5, 6], [4, 5, 6]],
}
# The appendix table per number of classes: 10 (MNIST, CIFAR-10, and here Fashion-MNIST
# and digits) and 7 (HAM10000).
PAPER_DIVISIONS_BY_CLASSES: dict[int, dict[int, list[list[int]]]] = {
    PAPER_NUM_CLASSES: PAPER_DIVISIONS,
    7: HAM10000_PAPER_DIVISIONS,
}

_ACCEPTED = (
    "Accepted: 'paper' (the GEMS paper's table, K in {ks}), 'iid' (every node holds every "
    "class), 'classes-per-node:N' (node k holds classes (k*N + i) % num_classes, i < N), "
    "'dirichlet:ALPHA' or 'dirichlet:ALPHA:MIN' (each class's shares over the nodes drawn "
    "from Dirichlet(ALPHA); every node at least MIN samples, default 10), or "
    "an explicit division with one group of comma-separated class labels per node, groups "
    "separated by '/', e.g. '0,1/2,3/4,5/6,7/8,9'."
)


def _accepted() -> str:
    """Return the description of every accepted ``label-division`` form."""
    return _ACCEPTED.format(ks=sorted(PAPER_DIVISIONS))


def _division_error(spec: str, problem: str) -> ValueError:
    """Build a ``ValueError`` for an invalid ``label-division`` setting."""
    return ValueError(f"label-division {spec!r}: {problem} {_accepted()}")


def _check_positive_int(value: object, what: str) -> int:
    """Return ``value`` as an int, or raise unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}.")
    return int(value)


def _check_seed(seed: object) -> int:
    """Return ``seed`` as an int, or raise unless it is a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
    return int(seed)


def _paper_division(spec: str, num_nodes: int, num_classes: int) -> list[list[int]]:
    """Return the paper's division for ``num_nodes`` nodes and ``num_classes`` classes."""
    table = PAPER_DIVISIONS_BY_CLASSES.get(num_classes)
    if table is None:
        raise _division_error(
            spec, f"the paper's table is for {' or '.join(map(str, sorted(PAPER_DIVISIONS_BY_CLASSES)))} "
            f"classes, but the dataset has {num_classes}; use 'classes-per-node:N' or an explicit "
            "division instead."
        )
    if num_nodes not in table:
        raise _division_error(
            spec, f"the paper's table has no division for {num_nodes} nodes and {num_classes} "
            f"classes (available for K in {sorted(table)}); use 'classes-per-node:N' or an "
            "explicit division instead."
        )
    return [list(group) for group in table[num_nodes]]


def _classes_per_node(spec: str, value: str, num_nodes: int, num_classes: int) -> list[list[int]]:
    """Return the rotating division in which each node holds ``value`` consecutive classes."""
    try:
        per_node = int(value.strip())
    except ValueError:
        raise _division_error(spec, f"N in 'classes-per-node:N' must be an integer, got {value!r}.") from None
    if not 1 <= per_node <= num_classes:
        raise _division_error(
            spec, f"N in 'classes-per-node:N' must be in 1..{num_classes} (the number of classes), "
            f"got {per_node}."
        )
    return [sorted((k * per_node + i) % num_classes for i in range(per_node)) for k in range(num_nodes)]


def _parse_group(spec: str, node: int, group: str, num_classes: int) -> list[int]:
    """Parse one node's comma-separated class labels."""
    items = [item.strip() for item in group.split(",") if item.strip()]
    if not items:
        raise _division_error(spec, f"node {node} holds no class; every node needs at least one.")
    labels = []
    for item in items:
        try:
            label = int(item)
        except ValueError:
            raise _division_error(spec, f"node {node}: {item!r} is not an integer class label.") from None
        if not 0 <= label < num_classes:
            raise _division_error(
                spec, f"node {node}: class {label} is out of range; labels must be in 0..{num_classes - 1}."
            )
        labels.append(label)
    if len(set(labels)) != len(labels):
        raise _division_error(spec, f"node {node} lists a class more than once ({group.strip()!r}).")
    return sorted(labels)


def _explicit_division(spec: str, num_nodes: int, num_classes: int) -> list[list[int]]:
    """Parse an explicit division such as ``'0,1/2,3'``."""
    groups = spec.split("/")
    if len(groups) != num_nodes:
        raise _division_error(
            spec, f"it has {len(groups)} group(s) separated by '/', but there are {num_nodes} nodes; "
            "give exactly one group per node."
        )
    return [_parse_group(spec, node, group, num_classes) for node, group in enumerate(groups)]


def parse_division(spec: str, num_nodes: int,
                   num_classes: int) -> list[list[int]] | DirichletDivision:
    """Turn the ``label-division`` setting into the classes held by each node.

    Parameters
    ----------
    spec : str
        ``"paper"``, ``"iid"``, ``"classes-per-node:N"`` or an explicit
        division such as ``"0,1/2,3/4,5/6,7/8,9"`` (keywords are
        case-insensitive, whitespace is ignored).
    num_nodes : int
        Number of nodes, >= 1.
    num_classes : int
        Number of classes of the dataset, >= 1.

    Returns
    -------
    list of list of int, or DirichletDivision
        One sorted, non-empty list of class labels per node. Classes held by
        no node are allowed; their samples are simply not used by any node.
        ``dirichlet:...`` gives a :class:`DirichletDivision` instead.

    Raises
    ------
    ValueError
        If the setting is malformed; the message names ``label-division``,
        says what was wrong and lists the accepted forms.
    """
    num_nodes = _check_positive_int(num_nodes, "num_nodes")
    num_classes = _check_positive_int(num_classes, "num_classes")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"label-division must be a non-empty string, got {spec!r}. {_accepted()}")
    text = spec.strip()
    keyword = text.lower().replace(" ", "")
    if keyword == "paper":
        return _paper_division(text, num_nodes, num_classes)
    if keyword == "iid":
        return [list(range(num_classes)) for _ in range(num_nodes)]
    if keyword.startswith("dirichlet:"):
        return parse_dirichlet(text, keyword.partition(":")[2], num_nodes)
    if keyword.startswith("classes-per-node"):
        head, sep, value = keyword.partition(":")
        if head != "classes-per-node" or not sep:
            raise _division_error(text, "expected the form 'classes-per-node:N'.")
        return _classes_per_node(text, value, num_nodes, num_classes)
    return _explicit_division(text, num_nodes, num_classes)


def _check_labels(labels: object) -> np.ndarray:
    """Return ``labels`` as a 1-D integer array, or raise ``ValueError``."""
    array = np.asarray(labels)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            f"labels must be a 1-D array of integer class labels, got dtype {array.dtype} "
            f"with shape {array.shape}."
        )
    return array


def check_division(division: Sequence[Sequence[int]], num_classes: int | None = None) -> list[list[int]]:
    """Validate a division and return it as a list of sorted lists of int.

    Parameters
    ----------
    division : sequence of sequence of int
        Classes held by each node, e.g. the output of :func:`parse_division`.
    num_classes : int, optional
        If given, every label must be below it.

    Raises
    ------
    ValueError
        If there are no nodes, a node holds no class or a class twice, or a
        label is not a non-negative integer (below ``num_classes``).
    """
    if isinstance(division, np.ndarray):
        division = division.tolist()
    if isinstance(division, (str, bytes)) or not isinstance(division, Sequence) or not division:
        raise ValueError(
            "division must be a non-empty list with one list of class labels per node, "
            f"got {division!r}; build it with parse_division()."
        )
    checked = []
    for node, group in enumerate(division):
        if isinstance(group, np.ndarray):
            group = group.tolist()
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence) or not group:
            raise ValueError(
                f"division: node {node} must hold a non-empty list of class labels, got {group!r}."
            )
        for label in group:
            if isinstance(label, bool) or not isinstance(label, numbers.Integral) or label < 0:
                raise ValueError(
                    f"division: node {node} has {label!r}, which is not a non-negative integer label."
                )
            if num_classes is not None and label >= num_classes:
                raise ValueError(
                    f"division: node {node} holds class {label}, but the dataset has only "
                    f"{num_classes} classes (0..{num_classes - 1})."
                )
        if len(set(group)) != len(group):
            raise ValueError(f"division: node {node} lists a class more than once: {list(group)}.")
        checked.append(sorted(int(label) for label in group))
    return checked


def share_sizes(labels: np.ndarray, division: Sequence[Sequence[int]]) -> np.ndarray:
    """How many samples of each class each node receives: ``(num_nodes, num_classes)``.

    Each class's ``n`` samples are split among its ``h`` holders as evenly as possible
    (``n // h`` each); the ``n % h`` leftovers go, one each, to the holders that have
    received the fewest samples of this split so far, ties broken round-robin (a cursor
    over the nodes that moves on after every class). So leftovers of successive classes
    go to successive nodes instead of always to the first ones: with ``iid`` every node
    gets a sample as long as there are at least as many samples as nodes, and a node
    that got nothing of one class is first in line for the next. The sizes depend only
    on the class counts, not on the seed.
    """
    labels = _check_labels(labels)
    division = check_division(division)
    num_nodes = len(division)
    num_classes = max(max(group) for group in division) + 1
    if labels.size:
        num_classes = max(num_classes, int(labels.max()) + 1)
    counts = np.bincount(labels, minlength=num_classes) if labels.size else np.zeros(num_classes, int)
    sizes = np.zeros((num_nodes, num_classes), dtype=np.int64)
    received = np.zeros(num_nodes, dtype=np.int64)
    holders: dict[int, list[int]] = {}
    for node, group in enumerate(division):
        for label in group:
            holders.setdefault(label, []).append(node)
    cursor = 0
    for label in sorted(holders):
        nodes = holders[label]
        base, extra = divmod(int(counts[label]), len(nodes))
        order = sorted(nodes, key=lambda k: (received[k], (k - cursor) % num_nodes))
        for k in nodes:
            sizes[k, label] = base
        for k in order[:extra]:
            sizes[k, label] += 1
        if extra:
            cursor = (order[extra - 1] + 1) % num_nodes
        for k in nodes:
            received[k] += sizes[k, label]
    return sizes


def partition_indices(
    labels: np.ndarray, division: Sequence[Sequence[int]], seed: int
) -> list[np.ndarray]:
    """Share the sample indices out among nodes according to a label division.

    For each held class (in increasing order) the indices of that class are
    shuffled with one ``np.random.default_rng(seed)`` and cut, in node order, into
    the shares of :func:`share_sizes` (even, leftovers spread round-robin), so the
    shares of a class differ by at most one sample and no sample goes to two nodes.

    Parameters
    ----------
    labels : np.ndarray
        Integer class label of each sample, shape ``(n,)``.
    division : sequence of sequence of int
        Classes held by each node.
    seed : int
        Non-negative seed; equal seeds give equal partitions.

    Returns
    -------
    list of np.ndarray
        One sorted int64 index array per node.
    """
    labels = _check_labels(labels)
    division = check_division(division)
    rng = np.random.default_rng(_check_seed(seed))
    sizes = share_sizes(labels, division)
    holders: dict[int, list[int]] = {}
    for node, group in enumerate(division):
        for label in group:
            holders.setdefault(label, []).append(node)
    shares: list[list[np.ndarray]] = [[np.empty(0, dtype=np.int64)] for _ in division]
    for label in sorted(holders):
        idx = np.flatnonzero(labels == label)
        rng.shuffle(idx)
        cuts = np.cumsum([sizes[node, label] for node in holders[label]])[:-1]
        for node, chunk in zip(holders[label], np.split(idx, cuts)):
            shares[node].append(chunk)
    return [np.sort(np.concatenate(parts)).astype(np.int64, copy=False) for parts in shares]


def _shared_partition(labels: np.ndarray, division: Sequence[Sequence[int]],
                      seed: int) -> list[np.ndarray]:
    """:func:`partition_indices`, computed once per process for each labels, division and
    seed: every node of a simulation (and the server, for all of them) asks for the same
    partition, which at 1,000 nodes costs tens of milliseconds each time."""
    return _cached_partition(np.ascontiguousarray(labels, dtype=np.int64).tobytes(),
                             tuple(tuple(int(c) for c in group) for group in division), seed)


@lru_cache(maxsize=8)
def _cached_partition(label_bytes: bytes, division: tuple[tuple[int, ...], ...],
                      seed: int) -> list[np.ndarray]:
    shares = partition_indices(np.frombuffer(label_bytes, dtype=np.int64), division, seed)
    for share in shares:
        share.setflags(write=False)  # shared between callers
    return shares


def check_partition_sizes(
    train_labels: np.ndarray,
    val_labels: np.ndarray,
    division: Sequence[Sequence[int]],
    *,
    spec: str = "",
    seed: int = 0,
    min_train_per_class: int = 1,
    min_val: int = 1,
    min_val_per_class: int = 0,
) -> np.ndarray:
    """Refuse a division that leaves a node with too little data, before the run starts.

    Every node must get at least ``min_train_per_class`` training samples of each class
    it holds, at least ``min_val`` validation samples in all (its radius search needs
    them) and at least ``min_val_per_class`` validation samples of each class it holds.
    The sizes are exact (:func:`share_sizes`; they do not depend on the seed).

    Parameters
    ----------
    train_labels, val_labels : np.ndarray
        Labels of the training and validation pools that are partitioned.
    division : sequence of sequence of int
        Classes held by each node (see :func:`parse_division`).
    spec : str
        The ``label-division`` setting, named in the message.
    seed : int
        The run's seed (a Dirichlet division's draw depends on it; the others do not).

    Returns
    -------
    np.ndarray
        ``(num_nodes, 2)``: training and validation samples of each node.

    Raises
    ------
    ValueError
        Naming the first nodes that fall short, the ``label-division`` setting, and
        the fix: the largest number of nodes (and for ``classes-per-node:N`` the largest
        ``N``) with which every node gets enough data.
    """
    if isinstance(division, DirichletDivision):  # raises with the fix when a node falls short
        shares = dirichlet_shares(train_labels, val_labels, division, seed)
        return np.array([[len(tr), len(va)] for tr, va in shares])
    division = check_division(division)
    limits = dict(min_train_per_class=min_train_per_class, min_val=min_val,
                  min_val_per_class=min_val_per_class)
    problems = _size_problems(train_labels, val_labels, division, **limits)
    train = share_sizes(train_labels, division).sum(axis=1)
    val = share_sizes(val_labels, division).sum(axis=1)
    if not problems:
        return np.stack([train, val], axis=1)
    num_nodes = len(division)
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    setting = f"label-division {spec!r}" if spec else "the label division"
    fixes = []
    if spec:
        num_classes = max(int(np.max(train_labels, initial=0)), int(np.max(val_labels, initial=0)),
                          max(max(g) for g in division)) + 1
        most = _largest_passing(
            lambda k: parse_division(spec, k, num_classes), num_nodes - 1, train_labels,
            val_labels, limits)
        if most:
            fixes.append(f"at most {most} nodes with this division")
        keyword = spec.strip().lower().replace(" ", "")
        if keyword.startswith("classes-per-node:"):
            per = _largest_passing(
                lambda s: parse_division(f"classes-per-node:{s}", num_nodes, num_classes),
                int(keyword.partition(":")[2]) - 1, train_labels, val_labels, limits)
            if per:
                fixes.append(f"label-division='classes-per-node:{per}' with {num_nodes} nodes")
    fixes.append("a larger dataset")
    raise ValueError(
        f"{setting} with {num_nodes} nodes leaves nodes with too little data: {shown}. "
        f"Use {' or '.join(fixes)}."
    )


def _size_problems(train_labels, val_labels, division, *, min_train_per_class: int,
                   min_val: int, min_val_per_class: int) -> list[str]:
    """One line per node that falls short of the limits (see check_partition_sizes)."""
    train = share_sizes(train_labels, division)
    val = share_sizes(val_labels, division)
    problems = []
    for node, group in enumerate(division):
        short = [c for c in group if train[node, c] < min_train_per_class]
        if short:
            problems.append(f"node {node} gets {min(train[node, c] for c in short)} training "
                            f"samples of class {short[0]} (needs >= {min_train_per_class})")
            continue
        if val[node].sum() < min_val:
            problems.append(f"node {node} gets {int(val[node].sum())} validation samples "
                            f"(needs >= {min_val})")
            continue
        short = [c for c in group if val[node, c] < min_val_per_class]
        if short:
            problems.append(f"node {node} gets {int(val[node, short[0]])} validation samples "
                            f"of class {short[0]} (needs >= {min_val_per_class} per class)")
    return problems


def _largest_passing(make_division, upper: int, train_labels, val_labels, limits) -> int:
    """The largest ``v`` in ``1..upper`` whose ``make_division(v)`` passes (0: none)."""
    for value in range(upper, 0, -1):
        try:
            division = make_division(value)
        except ValueError:
            continue
        if not _size_problems(train_labels, val_labels, division, **limits):
            return value
    return 0


def node_data(
    splits: DatasetSplits, division: Sequence[Sequence[int]], node_id: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return one node's training and validation data.

    The train and val splits are partitioned independently, with seeds
    ``seed`` and ``seed + 1``.

    Parameters
    ----------
    splits : DatasetSplits
        The dataset.
    division : sequence of sequence of int
        Classes held by each node (see :func:`parse_division`).
    node_id : int
        Node index in ``0..len(division) - 1``.
    seed : int
        Non-negative partition seed.

    Returns
    -------
    x_train, y_train, x_val, y_val : np.ndarray
        Fresh copies of the node's samples.
    """
    valid_id = isinstance(node_id, numbers.Integral) and not isinstance(node_id, bool)
    if isinstance(division, DirichletDivision):
        if not valid_id or not 0 <= node_id < division.num_nodes:
            raise ValueError(f"node_id must be an integer in 0..{division.num_nodes - 1}, "
                             f"got {node_id!r}.")
        train_rows, val_rows = dirichlet_shares(splits.train_y, splits.val_y, division,
                                                _check_seed(seed))[node_id]
        pools = (splits.train_x, splits.train_y), (splits.val_x, splits.val_y)
        return (*pool_rows(*pools, train_rows), *pool_rows(*pools, val_rows))
    division = check_division(division, splits.num_classes)
    if not valid_id or not 0 <= node_id < len(division):
        raise ValueError(
            f"node_id must be an integer in 0..{len(division) - 1} (the division has "
            f"{len(division)} nodes), got {node_id!r}."
        )
    seed = _check_seed(seed)
    train_idx = _shared_partition(splits.train_y, division, seed)[node_id]
    val_idx = _shared_partition(splits.val_y, division, seed + 1)[node_id]
    return (
        splits.train_x[train_idx], splits.train_y[train_idx],
        splits.val_x[val_idx], splits.val_y[val_idx],
    )


def division_json(division: Sequence[Sequence[int]] | DirichletDivision) -> object:
    """A division as the results record it: the class lists, or the Dirichlet parameters."""
    if isinstance(division, DirichletDivision):
        return division.to_json()
    return [list(map(int, group)) for group in division]
