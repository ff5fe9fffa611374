"""Dataset loading and the seeded train / validation / test / public split.

Splits follow the GEMS paper (50000 train, 5000 validation, 5000 test) and add
a *public* pool that no node ever sees, which the server uses for fine-tuning.
Raw decoded arrays are cached per process; every split is a fresh copy.
"""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gems_fl.data.download import try_torchvision_download
from gems_fl.data.idx import ScaledImages, read_idx

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# Classes of the IDX datasets and digits; every dataset's count is its entry's ``classes``.
NUM_CLASSES = 10

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

_HOW_TO_GET = {
    "fashion-mnist": (
        "Install it with `apt-get install dataset-fashion-mnist` (files go to "
        f"{DEFAULT_FASHION_MNIST_DIR}), or download the four IDX files "
        "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
        "t10k-labels-idx1-ubyte.gz) from the Fashion-MNIST GitHub release "
        "(https://github.com/zalandoresearch/fashion-mnist, folder data/fashion) into a folder "
        "and pass it via the run setting `data-dir`."
    ),
    "mnist": (
        "Download the four IDX files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) from the MNIST site "
        "(https://yann.lecun.com/exdb/mnist/) or with "
        "`torchvision.datasets.MNIST(root=FOLDER, download=True)` into a folder and pass it "
        "via the run setting `data-dir`."
    ),
}

# Paper split: 50000 train / 5000 val / 5000 public out of the 60000 official
# training images; 5000 of the 10000 official test images.
_TRAIN_PARTS = (50, 5)
_TRAIN_WHOLE = 60
# Digits has no official split: 50000/5000/5000 plus a 10000 public pool, out of 70000.
_DIGITS_PARTS = (50, 5, 5)
_DIGITS_WHOLE = 70


@dataclass(frozen=True)
class FeatureOptions:
    """How CIFAR-10 and HAM10000 are turned into features (ignored by the other datasets).

    Attributes
    ----------
    vgg16_weights : str
        Local VGG-16 state dict file for CIFAR-10; empty: fetch torchvision's ImageNet
        weights (needs torchvision and internet).
    feature_cache_dir : str
        Folder of the feature cache; empty: ``~/.cache/gems-fl/features``.
    ham10000_per_class : int
        Images per class after HAM10000's balancing (the paper: 2000).
    ham10000_cnn_epochs : int
        Training epochs of HAM10000's feature CNN.
    device : str
        Where the VGG-16 extraction and HAM10000's CNN run: ``auto``, ``cpu`` or
        ``cuda`` (see :func:`gems_fl.learning.train.resolve_device`). Not part of the
        feature cache's key: features computed on either device are reused.
    """

    vgg16_weights: str = ""
    feature_cache_dir: str = ""
    ham10000_per_class: int = 2000
    ham10000_cnn_epochs: int = 10
    device: str = "auto"

    @classmethod
    def from_settings(cls, settings: object) -> FeatureOptions:
        """Take the fields of the same names from a ``gems_fl.settings.Settings``."""
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})


@dataclass
class DatasetSplits:
    """All splits of one dataset.

    Features are float32 with shape ``(n, num_features)``: pixels in ``[0, 1]`` for
    digits and the IDX datasets, non-negative extracted features for CIFAR-10 and
    HAM10000; labels are int64 with shape ``(n,)``.

    Attributes
    ----------
    train_x, train_y : np.ndarray
        Pool that the nodes' training data is partitioned from.
    val_x, val_y : np.ndarray
        Pool that the nodes' validation data (used for the space radius) is
        partitioned from.
    test_x, test_y : np.ndarray
        Held-out evaluation set.
    public_x, public_y : np.ndarray
        Data that no node uses; the server's pool for fine-tuning.
    name : str
        Canonical dataset name, one of ``DATASET_NAMES``.
    num_classes : int
        Number of label classes.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    public_x: np.ndarray
    public_y: np.ndarray
    name: str
    num_classes: int

    @property
    def num_features(self) -> int:
        """Number of features per sample."""
        return int(self.train_x.shape[1])

    def split_sizes(self) -> dict[str, int]:
        """Return the number of samples of each split, keyed by split name."""
        return {
            "train": len(self.train_y),
            "val": len(self.val_y),
            "test": len(self.test_y),
            "public": len(self.public_y),
        }


def _check_seed(seed: object) -> int:
    """Return ``seed`` as an int, or raise if it is not a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}.")
    return int(seed)


def dataset_named(name: object) -> Dataset:
    """The registered dataset ``name`` (case- and ``_``/``-``-insensitive).

    Raises
    ------
    ValueError
        No dataset of that name; the message lists the names there are.
    """
    key = str(name).strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key not in DATASETS:
        raise ValueError(
            f"Unknown dataset {name!r}; valid names are {', '.join(DATASET_NAMES)}."
        )
    return DATASETS[key]


def _readonly(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Mark ``arrays`` read-only in place and return them."""
    for array in arrays:
        array.setflags(write=False)
    return arrays


def idx_file_candidates(name: str, data_dir: Path, stem: str) -> list[Path]:
    """Every path where the IDX file ``stem`` of dataset ``name`` may be: plain or
    ``.gz``, in ``data_dir`` or in torchvision's layout under it (the loader and the
    preflight look in the same places)."""
    folders = [data_dir, data_dir / DATASETS[name].idx_subdir / "raw"]
    return [folder / f"{stem}{suffix}" for folder in folders for suffix in ("", ".gz")]


def _find_idx_files(name: str, data_dir: Path) -> dict[str, Path] | list[tuple[str, list[Path]]]:
    """Locate the four IDX files; return their paths, or the missing ones with the paths tried."""
    found, missing = {}, []
    for key, stem in IDX_FILES.items():
        candidates = idx_file_candidates(name, data_dir, stem)
        hit = next((p for p in candidates if p.is_file()), None)
        if hit is None:
            missing.append((stem, candidates))
        else:
            found[key] = hit
    return missing if missing else found


def _missing_file_error(name: str, missing: list[tuple[str, list[Path]]], note: str) -> FileNotFoundError:
    """Build the error for IDX files that could not be found."""
    stem, tried = missing[0]
    others = [m[0] for m in missing[1:]]
    lines = [
        f"{name}: IDX file {stem!r} (plain or .gz) not found. Looked in:",
        *(f"  {p}" for p in tried),
    ]
    if others:
        lines.append(f"Also missing: {', '.join(others)}.")
    if note:
        lines.append(note)
    lines.append(_how_to_get(name))
    return FileNotFoundError("\n".join(lines))


def _check_idx_pair(images: np.ndarray, labels: np.ndarray, img_path: Path, lbl_path: Path) -> None:
    """Validate that an image file and a label file belong together."""
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(
            f"IDX file {str(img_path)!r}: expected uint8 images of shape (n, height, width) "
            f"(magic 0x00000803), found dtype {images.dtype} with shape {images.shape}."
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"IDX file {str(lbl_path)!r}: expected integer labels of shape (n,) "
            f"(magic 0x00000801), found dtype {labels.dtype} with shape {labels.shape}."
        )
    if len(images) != len(labels):
        raise ValueError(
            f"IDX files {str(img_path)!r} and {str(lbl_path)!r}: expected as many labels as "
            f"images, found {len(labels)} labels for {len(images)} images."
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(
            f"IDX file {str(lbl_path)!r}: expected labels in 0..{NUM_CLASSES - 1}, "
            f"found values from {labels.min()} to {labels.max()}."
        )


@functools.lru_cache(maxsize=4)
def _load_idx_dataset(name: str, data_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read and validate the four IDX files of ``name`` in ``data_dir`` (cached, read-only).

    Returns
    -------
    tuple of np.ndarray
        ``(train_images, train_labels, test_images, test_labels)``, read-only.
    """
    folder = Path(data_dir)
    located = _find_idx_files(name, folder)
    if isinstance(located, list) and DATASETS[name].downloads:
        note = try_torchvision_download(folder)
        located = _find_idx_files(name, folder)
    else:
        note = ""
    if isinstance(located, list):
        raise _missing_file_error(name, located, note)
    arrays = {key: read_idx(path) for key, path in located.items()}
    for part in ("train", "test"):
        _check_idx_pair(
            arrays[f"{part}_images"], arrays[f"{part}_labels"],
            located[f"{part}_images"], located[f"{part}_labels"],
        )
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise ValueError(
            f"{name} in {data_dir!r}: expected train and test images of the same size, found "
            f"{arrays['train_images'].shape[1:]} and {arrays['test_images'].shape[1:]}."
        )
    return _readonly(
        arrays["train_images"], arrays["train_labels"],
        arrays["test_images"], arrays["test_labels"],
    )


@functools.lru_cache(maxsize=1)
def _load_digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """Return sklearn's bundled digits as read-only ``(features in [0, 1], labels)``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    return _readonly(x, y)


@functools.lru_cache(maxsize=2)
def _cifar10_features(data_dir: str, weights: str, cache_dir: str, device: str = "auto") -> tuple[np.ndarray, ...]:
    from gems_fl.data.cifar10 import cifar10_features

    return _readonly(*cifar10_features(data_dir, weights, cache_dir, device=device))


@functools.lru_cache(maxsize=2)
def _ham10000_features(data_dir: str, seed: int, options: FeatureOptions) -> dict[str, tuple[np.ndarray, ...]]:
    from gems_fl.data.ham10000 import ham10000_splits

    parts = ham10000_splits(data_dir, seed, options.ham10000_per_class,
                            options.ham10000_cnn_epochs, options.feature_cache_dir,
                            device=options.device)
    return {name: _readonly(x, y) for name, (x, y) in parts.items()}


def clear_dataset_cache() -> None:
    """Forget every cached raw dataset (e.g. after files on disk have changed)."""
    shared_splits.cache_clear()
    _load_idx_dataset.cache_clear()
    _load_digits_raw.cache_clear()
    _cifar10_features.cache_clear()
    _ham10000_features.cache_clear()


def _feature_splits(name: str, parts: dict[str, tuple[np.ndarray, np.ndarray]]) -> DatasetSplits:
    """``DatasetSplits`` holding fresh copies of ``parts`` (keys train, val, test, public)."""
    kwargs = {}
    for split, (x, y) in parts.items():
        kwargs[f"{split}_x"] = np.array(x, dtype=np.float32)
        kwargs[f"{split}_y"] = np.array(y, dtype=np.int64)
    return DatasetSplits(**kwargs, name=name, num_classes=DATASETS[name].classes)


def _split_cifar10(data_dir: str, seed: int, options: FeatureOptions) -> DatasetSplits:
    from gems_fl.data.cifar10 import split_cifar10

    arrays = _cifar10_features(data_dir, options.vgg16_weights, options.feature_cache_dir,
                               options.device)
    return _feature_splits("cifar10", split_cifar10(*arrays, seed=seed))


def _split_digits(seed: int) -> DatasetSplits:
    """Stratified split of sklearn digits in the proportions 50:5:5:10."""
    from sklearn.model_selection import train_test_split

    x, y = _load_digits_raw()
    n = len(y)
    n_train, n_val, n_test = (round(n * p / _DIGITS_WHOLE) for p in _DIGITS_PARTS)
    idx = np.arange(n)
    train_idx, rest = train_test_split(idx, train_size=n_train, stratify=y, random_state=seed)
    val_idx, rest = train_test_split(rest, train_size=n_val, stratify=y[rest], random_state=seed)
    test_idx, public_idx = train_test_split(rest, train_size=n_test, stratify=y[rest], random_state=seed)
    return DatasetSplits(
        train_x=x[train_idx], train_y=y[train_idx],
        val_x=x[val_idx], val_y=y[val_idx],
        test_x=x[test_idx], test_y=y[test_idx],
        public_x=x[public_idx], public_y=y[public_idx],
        name="digits", num_classes=NUM_CLASSES,
    )


def _idx_split_sizes(n_train_official: int, n_test_official: int, where: str) -> tuple[int, int, int]:
    """Return ``(n_train, n_val, n_test)``; the public pool is the rest of the official train set."""
    n_train = n_train_official * _TRAIN_PARTS[0] // _TRAIN_WHOLE
    n_val = n_train_official * _TRAIN_PARTS[1] // _TRAIN_WHOLE
    n_test = n_test_official // 2
    n_public = n_train_official - n_train - n_val
    if min(n_train, n_val, n_test, n_public) < 1:
        raise ValueError(
            f"{where}: expected at least {_TRAIN_WHOLE} training and 2 test images so that every "
            f"split is non-empty, found {n_train_official} training and {n_test_official} test images."
        )
    return n_train, n_val, n_test


def _split_idx_at(name: str, data_dir: str, seed: int, options: FeatureOptions) -> DatasetSplits:
    return _split_idx(name, data_dir, seed)


def _split_idx(name: str, data_dir: str, seed: int, scaled_when_taken: bool = False
               ) -> DatasetSplits:
    """Seeded train / val / public split of the official train set, and a test subset
    (features as :class:`ScaledImages` views of the read files if ``scaled_when_taken``)."""
    tr_img, tr_lbl, te_img, te_lbl = _load_idx_dataset(name, data_dir)
    n_train, n_val, n_test = _idx_split_sizes(len(tr_lbl), len(te_lbl), f"{name} in {data_dir!r}")
    rng = np.random.default_rng(seed)
    train_perm = rng.permutation(len(tr_lbl))
    test_perm = rng.permutation(len(te_lbl))
    parts = np.split(train_perm, [n_train, n_train + n_val])

    def features(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        if scaled_when_taken:
            return ScaledImages(images, idx)
        out = images[idx].reshape(len(idx), -1).astype(np.float32)
        out /= np.float32(255.0)
        return out

    def labels(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return values[idx].astype(np.int64)

    test_idx = test_perm[:n_test]
    return DatasetSplits(
        train_x=features(tr_img, parts[0]), train_y=labels(tr_lbl, parts[0]),
        val_x=features(tr_img, parts[1]), val_y=labels(tr_lbl, parts[1]),
        test_x=features(te_img, test_idx), test_y=labels(te_lbl, test_idx),
        public_x=features(tr_img, parts[2]), public_y=labels(tr_lbl, parts[2]),
        name=name, num_classes=NUM_CLASSES,
    )


def _how_to_get(name: str) -> str:
    if name == "cifar10":
        from gems_fl.data.cifar10 import HOW_TO_GET
        return HOW_TO_GET
    if name == "ham10000":
        from gems_fl.data.ham10000 import HOW_TO_GET
        return HOW_TO_GET
    return _HOW_TO_GET.get(name, "")


def _resolve_data_dir(dataset: Dataset, data_dir: str | os.PathLike | None) -> str:
    """Return the absolute data folder of a file-based dataset, applying its default."""
    if data_dir is None or (isinstance(data_dir, str) and not data_dir.strip()):
        if not dataset.default_dir:
            raise ValueError(
                f"Dataset {dataset.name!r} needs data_dir: pass the folder holding its files "
                "(e.g. via the run setting `data-dir`). " + _how_to_get(dataset.name)
            )
        data_dir = dataset.default_dir
    return os.path.abspath(os.fspath(data_dir))


def load_dataset(
    name: str, *, seed: int, data_dir: str | os.PathLike | None = None,
    features: FeatureOptions | None = None,
) -> DatasetSplits:
    """Load a dataset and split it into train / val / test / public, reproducibly.

    Parameters
    ----------
    name : str
        ``"digits"`` (sklearn's bundled 8x8 digits, offline), ``"fashion-mnist"``
        or ``"mnist"`` (IDX files).
    seed : int
        Seed of the split, in ``[0, 2**32)``.
    data_dir : str or os.PathLike, optional
        Folder with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
        ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each plain or
        ``.gz``; the torchvision layout ``<data_dir>/MNIST/raw`` or
        ``<data_dir>/FashionMNIST/raw`` is also searched). Defaults to
        ``/usr/share/datasets/fashion-mnist`` for Fashion-MNIST; required for
        MNIST; ignored for digits. For ``"cifar10"`` the folder holding
        ``cifar-10-batches-py`` (or the batch files themselves), for
        ``"ham10000"`` the folder with ``HAM10000_metadata.csv`` and the JPEG
        folders; required for both.
    features : FeatureOptions, optional
        Weights, cache folder and HAM10000 settings of the feature extraction of
        ``"cifar10"`` and ``"ham10000"`` (defaults: ``FeatureOptions()``).

    Returns
    -------
    DatasetSplits
        Fresh arrays owned by the caller. For IDX datasets the official train
        set is shuffled and split 50:5:5 into train, val and public (50000 /
        5000 / 5000 for 60000 images) and half the official test set (5000)
        is the test split. Digits is split 50:5:5:10 (train, val, test,
        public), stratified by label. CIFAR-10: 45000 train and 5000 public from
        the official training batches, 5000 val and 5000 test from the test
        batch (see ``gems_fl.data.cifar10``). HAM10000: 70/10/10/10 per class
        (train, public, val, test) after balancing (see ``gems_fl.data.ham10000``).

    Raises
    ------
    ValueError
        Unknown name, invalid seed, missing ``data_dir`` for MNIST, or
        malformed files.
    FileNotFoundError
        If an IDX file is missing; the message lists every path tried and how
        to obtain the files.
    """
    dataset = dataset_named(name)
    seed = _check_seed(seed)
    folder = _resolve_data_dir(dataset, data_dir) if dataset.files else ""
    return dataset.load(folder, seed, features if features is not None else FeatureOptions())


@functools.lru_cache(maxsize=2)
def shared_splits(name: str, seed: int, data_dir: str | None,
                  features: FeatureOptions | None = None) -> DatasetSplits:
    """:func:`load_dataset`'s splits, computed once per process and read-only.

    A node answers several messages (identify, train, evaluate) and in a simulation one
    process serves many nodes: each takes its rows from these arrays (fancy indexing
    copies them) instead of decoding and scaling the whole dataset again. An IDX dataset's
    features are :class:`ScaledImages` views: each node's rows scaled when taken, the same.
    """
    dataset = dataset_named(name)
    if dataset.files == "idx":  # the images stay as read; each node's rows scaled when taken
        splits = _split_idx(dataset.name, _resolve_data_dir(dataset, data_dir), _check_seed(seed),
                            scaled_when_taken=True)
    else:
        splits = load_dataset(name, seed=seed, data_dir=data_dir, features=features)
    for value in vars(splits).values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return splits


def _load_digits(folder: str, seed: int, options: FeatureOptions) -> DatasetSplits:
    return _split_digits(seed)


def _load_cifar10(folder: str, seed: int, options: FeatureOptions) -> DatasetSplits:
    return _split_cifar10(folder, seed, options)


def _load_ham10000(folder: str, seed: int, options: FeatureOptions) -> DatasetSplits:
    return _feature_splits("ham10000", _ham10000_features(folder, seed, options))


@dataclass(frozen=True)
class Dataset:
    """One dataset the product partitions over simulated nodes: what a row is, what it
    needs on disk, and how it loads (``load(folder, seed, features)``: the seeded train /
    validation / test / public splits; ``folder`` is empty for a bundled dataset).

    ``files`` names the on-disk format the preflight checks (``""``: bundled, nothing
    on disk; ``idx``; ``cifar10``; ``ham10000``), ``default_dir`` where it is looked for
    when ``data-dir`` is empty, ``idx_subdir`` torchvision's folder for IDX files,
    ``downloads`` whether a missing file is fetched through torchvision, ``sized``
    whether it is cheap enough to load for sizing the partition before a run, and
    ``hidden`` the MLP's hidden width for ``hidden='auto'``.
    """

    name: str
    features: int
    classes: int
    rows: str
    load: Callable[[str, int, FeatureOptions], DatasetSplits]
    files: str = ""
    default_dir: str = ""
    idx_subdir: str = ""
    downloads: bool = False
    sized: bool = False
    hidden: str = "50"
    readme_section: str = '"Settings"'


#: every dataset by name (the ``dataset`` setting's choices, with ``node-files``)
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("digits", 64, 10, "8x8 grey pixels (scikit-learn's bundled digits)", _load_digits,
            sized=True),
    Dataset("fashion-mnist", 784, 10, "28x28 grey pixels, scaled to [0, 1]",
            functools.partial(_split_idx_at, "fashion-mnist"), files="idx",
            default_dir=DEFAULT_FASHION_MNIST_DIR, idx_subdir="FashionMNIST", sized=True),
    Dataset("mnist", 784, 10, "28x28 grey pixels, scaled to [0, 1]",
            functools.partial(_split_idx_at, "mnist"), files="idx", idx_subdir="MNIST",
            downloads=True, sized=True),
    # CIFAR-10 and HAM10000 are represented by 512 extracted features (cifar10.py, ham10000.py)
    Dataset("cifar10", 512, 10, "512 VGG-16 features of a 32x32 colour image", _load_cifar10,
            files="cifar10", hidden="100", readme_section='"CIFAR-10"'),
    Dataset("ham10000", 512, 7, "512 CNN features of a skin-lesion image", _load_ham10000,
            files="ham10000", readme_section='"HAM10000"'),
)}
DATASET_NAMES = tuple(DATASETS)
#: (num_features, num_classes) of each dataset, known without its files: a server that
#: holds no data still checks every reply's shapes against the model
DATASET_SHAPES = {name: (d.features, d.classes) for name, d in DATASETS.items()}
