"""Checks a run can pass before any process starts: data, division, nodes, output folder.

Everything here is knowable on the launching machine in well under a second, and each
failure otherwise surfaces only after the SuperLink, the simulation and Ray are up
(tens of seconds and hundreds of log lines later). :func:`preflight` raises
:class:`PreflightError` with one line that names the setting and says how to fix it.

The same function serves the ServerApp (``preflight(settings)`` at the top of its run,
where the node count is not known yet and the data is only checked when the server
loads it) and ``gems-fl run`` (``preflight(settings, num_nodes)``: every check).
"""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path

from gems_fl.data.agreement import NODE_FILES, Scaling
from gems_fl.data.datasets import DATASETS, Dataset, idx_file_candidates
from gems_fl.settings import DataSettings, Settings, SettingsError

# (magic type code, dimensions) of the four IDX files: uint8 images (n, h, w), uint8 labels (n,).
_IDX_EXPECTED = {
    "train-images-idx3-ubyte": 3, "train-labels-idx1-ubyte": 1,
    "t10k-images-idx3-ubyte": 3, "t10k-labels-idx1-ubyte": 1,
}
_IDX_ITEM_SIZE = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}
_CHUNK = 1 << 20


class PreflightError(SettingsError):
    """A run cannot succeed as configured; the one-line message names the setting and the fix."""


def preflight(settings: Settings, num_nodes: int | None = None, *, check_data: bool = True,
              writes: bool = True) -> None:
    """Raise :class:`PreflightError` for the first check the run would fail.

    Parameters
    ----------
    settings : Settings
        The validated run settings.
    num_nodes : int, optional
        Number of nodes the run will have (``gems-fl run --nodes``). Given, the node
        count is checked against ``min-replies`` and the ``label-division``; ``None``
        (the ServerApp before its nodes connected) skips those two checks.
    check_data : bool
        Check the dataset's files (``data-dir``) exist and parse. The ServerApp passes
        ``settings.evaluate_on_server``: a server that holds no data needs no files.
    writes : bool
        The run writes its results into ``output-dir`` (checked writable); False for a
        run that keeps them in memory (:func:`gems_fl.fitting.fit`).
    """
    data = settings.part(DataSettings)
    if num_nodes is not None:
        check_nodes(settings.min_replies, num_nodes)
        if data.dataset == NODE_FILES:
            check_site_files(data, num_nodes)
        else:
            check_division(data, num_nodes)
    if check_data:
        check_data_files(data)
        if num_nodes is not None:
            check_partition(data, settings.seed, num_nodes)
    check_public_data(data, settings.evaluate_on_server)
    check_feature_ranges(data)
    if writes:
        check_output_dir(settings.output_dir)


def check_feature_ranges(data: DataSettings) -> None:
    """``standardize='ranges'``: the ``feature-ranges`` file reads (its fit to the sites'
    columns is checked at the identity round, which knows them)."""
    if data.standardize != Scaling.RANGES:
        return
    from gems_fl.data.feature_ranges import FeatureRangesError, read_feature_ranges

    try:
        read_feature_ranges(data.feature_ranges)
    except FeatureRangesError as exc:
        raise PreflightError(str(exc)) from None


def check_partition(data: DataSettings, seed: int, num_nodes: int) -> None:
    """Every partition node gets training data of each class it holds and validation
    data (the run's division at ``seed``): refused here, with the largest node count that
    works, instead of mid-run."""
    if data.dataset not in DATASETS or not DATASETS[data.dataset].sized:
        return  # the feature pipelines of CIFAR-10 and HAM10000 are not run for a check
    from gems_fl.data import load_dataset, parse_division
    from gems_fl.data.partition import check_partition_sizes

    try:
        splits = load_dataset(data.dataset, seed=seed,
                              data_dir=data.data_dir or None)
    except Exception:  # noqa: BLE001 - e.g. bad label values: the nodes report it by name
        return
    division = parse_division(data.label_division, num_nodes, splits.num_classes)
    try:
        check_partition_sizes(splits.train_y, splits.val_y, division,
                              spec=data.label_division, seed=seed)
    except ValueError as exc:
        raise PreflightError(f"{_one_line(str(exc))} (with --nodes {num_nodes})") from None


def check_site_files(data: DataSettings, num_nodes: int) -> None:
    """A simulation on site files (``gems-fl run --site``): one existing file per node.
    What is in them is the identity round's to judge, as in a deployed run."""
    from gems_fl.data.nodes import site_files

    files = site_files(data.site_files)
    if not files:
        raise PreflightError(
            "dataset='node-files' trains on each node's own file: try site files in a local "
            "simulation with `gems-fl run --site site-a.csv --site site-b.csv ...`, or deploy "
            "SuperNodes with their files and use `gems-fl submit` (README, \"Your own data\")")
    if len(files) != num_nodes:
        raise PreflightError(f"site-files names {len(files)} file(s) for {num_nodes} nodes: "
                             "one file per node (gems-fl run --site sets both)")
    missing = [f for f in files if not Path(f).expanduser().is_file()]
    if missing:
        raise PreflightError(f"site file(s) not found: {', '.join(missing)}")


def check_public_data(data: DataSettings, evaluate_on_server: bool) -> None:
    """``public-data``, when set, is a readable file; with ``dataset='node-files'`` and
    ``evaluate-on-server=true`` it is the only data the server has."""
    path = data.public_data.strip()
    if data.dataset == NODE_FILES and evaluate_on_server and not path:
        raise PreflightError(
            "dataset='node-files' keeps the data on the nodes: set evaluate-on-server=false "
            "(the nodes evaluate every model on their own data), or give public-data")
    if not path:
        return
    from gems_fl.data.site_files import (
        SiteFileError,
        public_data_path,
        read_site_file,
        site_problems,
    )

    found = public_data_path(path)
    if found is None:
        raise PreflightError(
            f"public-data='{path}' is not a file on the machine running the ServerApp, nor the "
            "stem of one (<stem>.npz, <stem>.csv or <stem>_test.csv): give the path of an .npz "
            "(x, y [, x_test, y_test]) or .csv file (a <stem>_test.csv beside it is its test "
            "split; a <stem>_test.csv alone is a test set only), or leave it empty")
    path = str(found)
    # read now, before any node is contacted; its classes are checked later
    try:
        site = read_site_file(path, data.label_column, public=True,
                              id_columns=data.id_columns, categories=data.categories)
    except SiteFileError as exc:
        raise PreflightError(f"public-data: {_one_line(str(exc))}") from None
    features = data.num_features or None
    if data.dataset != NODE_FILES:
        features = DATASETS[data.dataset].features
    problems = site_problems(site, features, None, run="the run")
    if problems:
        raise PreflightError(f"public-data {path}: {'; '.join(problems)}")
    if data.dataset == NODE_FILES and evaluate_on_server and "test" not in site.x:
        raise PreflightError(
            f"public-data {path} has no test split, and with dataset='node-files' and "
            "evaluate-on-server=true it is the server's only test set: add x_test/y_test "
            "(or <stem>_test.csv), or set evaluate-on-server=false")


def check_nodes(min_replies: int, num_nodes: int) -> None:
    """At least one node, and at least ``min-replies`` of them."""
    if num_nodes < 1:
        raise PreflightError(f"--nodes {num_nodes}: a run needs at least one node, e.g. --nodes 5")
    if num_nodes < min_replies:
        raise PreflightError(
            f"min-replies={min_replies} but --nodes {num_nodes}: the run would wait for "
            f"replies that cannot come; start --nodes {min_replies} or more, or set "
            f"--run-config \"min-replies={num_nodes}\"")


def check_division(data: DataSettings, num_nodes: int) -> None:
    """``label-division`` fits ``num_nodes``; an explicit one gives each class to one node.

    A class listed for two nodes has its samples split between them, which is what the
    paper's K=2 division and ``iid`` mean to do, but in a hand-written division it is
    usually a typo, so it needs ``allow-overlap=true``.
    """
    from gems_fl.data import parse_division

    num_classes = DATASETS[data.dataset].classes
    try:
        division = parse_division(data.label_division, num_nodes, num_classes)
    except ValueError as exc:
        raise PreflightError(f"{_one_line(str(exc))} (with --nodes {num_nodes})") from None
    if not is_explicit_division(data.label_division) or data.allow_overlap:
        return
    holders: dict[int, list[int]] = {}
    for node, group in enumerate(division):
        for label in group:
            holders.setdefault(label, []).append(node)
    shared = {label: nodes for label, nodes in sorted(holders.items()) if len(nodes) > 1}
    if shared:
        label, nodes = next(iter(shared.items()))
        more = f" (and {len(shared) - 1} more class(es))" if len(shared) > 1 else ""
        raise PreflightError(
            f"label-division {data.label_division!r}: class {label} is held by nodes "
            f"{', '.join(map(str, nodes))}{more}; give each class to one node, or set "
            "--run-config \"lab='allow-overlap=true'\" to split its samples among them")


def is_explicit_division(spec: str) -> bool:
    """Whether ``spec`` is hand-written groups (not ``paper``, ``iid``,
    ``classes-per-node:N`` or ``dirichlet:ALPHA``)."""
    keyword = spec.strip().lower().replace(" ", "")
    return not (keyword in ("paper", "iid") or keyword.startswith(("classes-per-node", "dirichlet")))


def check_data_files(data: DataSettings) -> None:
    """The dataset's files are where ``data-dir`` says, and their headers and sizes are sound."""
    dataset = DATASETS.get(data.dataset)
    if dataset is None or not dataset.files:  # the sites' own files, or bundled
        return
    name, section = dataset.name, dataset.readme_section
    data_dir = data.data_dir.strip() or dataset.default_dir
    if not data_dir:
        raise PreflightError(
            f"data-dir is empty but dataset='{name}' needs its files: set "
            f"--run-config \"data-dir='/path/to/{name}'\" (see README, {section})")
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise PreflightError(
            f"data-dir='{data_dir}' is not a folder (dataset='{name}'): point data-dir at the "
            f"folder holding the {name} files (see README, {section})")
    check = {"idx": lambda: _check_idx_folder(dataset, folder, data_dir),
             "cifar10": lambda: _check_cifar10(folder, data_dir, data.vgg16_weights),
             "ham10000": lambda: _check_ham10000(folder, data_dir)}
    check[dataset.files]()


def _locate_idx(dataset: Dataset, folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The IDX files found (plain or .gz, also in torchvision's layout) and those missing."""
    found: dict[str, Path] = {}
    for stem in _IDX_EXPECTED:
        hit = next((p for p in idx_file_candidates(dataset.name, folder, stem) if p.is_file()),
                   None)
        if hit is not None:
            found[stem] = hit
    return found, [stem for stem in _IDX_EXPECTED if stem not in found]


def _check_idx_folder(dataset: Dataset, folder: Path, data_dir: str) -> None:
    name = dataset.name
    found, missing = _locate_idx(dataset, folder)
    if missing and dataset.downloads:  # the loader tries the same download
        from gems_fl.data.download import try_torchvision_download

        try_torchvision_download(folder)
        found, missing = _locate_idx(dataset, folder)
    if missing:
        raise PreflightError(
            f"data-dir='{data_dir}' holds no {name} IDX file {missing[0]} (plain or .gz)"
            f"{f' nor {len(missing) - 1} more' if len(missing) > 1 else ''}: put the four "
            f"IDX files there or point data-dir at the folder that has them")
    shapes = {stem: _idx_shape(path, data_dir) for stem, path in found.items()}
    for part, images, labels in (("train", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                                 ("test", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")):
        if shapes[images][0] != shapes[labels][0]:
            raise PreflightError(
                f"data-dir='{data_dir}': {found[images].name} has {shapes[images][0]} images but "
                f"{found[labels].name} {shapes[labels][0]} labels; the {part} files do not belong "
                "together, re-download them")
    if shapes["train-labels-idx1-ubyte"][0] < 60 or shapes["t10k-labels-idx1-ubyte"][0] < 2:
        raise PreflightError(
            f"data-dir='{data_dir}': {name} needs at least 60 training and 2 test images so every "
            "split is non-empty; the files there are too small")


def _idx_shape(path: Path, data_dir: str) -> tuple[int, ...]:
    """Shape from the IDX header, after checking magic, dimensions and the total size.

    A ``.gz`` file is decompressed as a stream (nothing kept), so a truncated or
    corrupt archive is caught without loading the images.
    """
    where = f"data-dir='{data_dir}': {path.name}"
    fix = "re-download it into data-dir"
    try:
        with path.open("rb") as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
        opener = gzip.open if compressed else open
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_ITEM_SIZE:
                raise PreflightError(f"{where} is not an IDX file (magic {head.hex() or 'missing'}); {fix}")
            ndim = head[3]
            expected_ndim = _IDX_EXPECTED[path.name.removesuffix(".gz")]
            if ndim != expected_ndim:
                raise PreflightError(f"{where} has {ndim} dimensions, expected {expected_ndim}; {fix}")
            dims = f.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise PreflightError(f"{where} is truncated inside its header; {fix}")
            shape = tuple(int.from_bytes(dims[i:i + 4], "big") for i in range(0, 4 * ndim, 4))
            expected = _IDX_ITEM_SIZE[head[2]]
            for d in shape:
                expected *= d
            size = 0
            while chunk := f.read(_CHUNK):
                size += len(chunk)
    except PreflightError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise PreflightError(f"{where} cannot be read ({_one_line(str(exc))}); {fix}") from None
    if size != expected:
        raise PreflightError(
            f"{where} holds {size} data bytes, its header {'x'.join(map(str, shape))} needs "
            f"{expected}: the file is truncated or corrupt; {fix}")
    return shape


def _check_cifar10(folder: Path, data_dir: str, weights: str) -> None:
    from gems_fl.data.cifar10 import SUBDIR, TEST_FILE, TRAIN_FILES

    names = (*TRAIN_FILES, TEST_FILE)
    home = next((d for d in (folder / SUBDIR, folder) if all((d / n).is_file() for n in names)), None)
    if home is None:
        missing = next(n for n in names if not (folder / SUBDIR / n).is_file())
        raise PreflightError(
            f"data-dir='{data_dir}' holds no CIFAR-10 batch file {missing} (in {SUBDIR}/ or "
            "directly): extract cifar-10-python.tar.gz there (see README, \"CIFAR-10\")")
    for n in names:
        with (home / n).open("rb") as f:
            if f.read(1) != b"\x80":
                raise PreflightError(
                    f"data-dir='{data_dir}': {home / n} is not a pickled CIFAR-10 batch; "
                    "re-extract cifar-10-python.tar.gz")
    if weights.strip() and not Path(weights).expanduser().is_file():
        raise PreflightError(
            f"vgg16-weights='{weights}' is not a file: give the path of vgg16-397923af.pth, "
            "or leave vgg16-weights empty to download it")


def _check_ham10000(folder: Path, data_dir: str) -> None:
    from gems_fl.data.ham10000 import METADATA_FILE

    path = folder / METADATA_FILE
    if not path.is_file():
        raise PreflightError(
            f"data-dir='{data_dir}' holds no {METADATA_FILE}: point data-dir at the HAM10000 "
            "folder (see README, \"HAM10000\")")
    with path.open(encoding="utf-8", errors="replace") as f:
        header = [c.strip() for c in f.readline().split(",")]
    if "image_id" not in header or "dx" not in header:
        raise PreflightError(
            f"data-dir='{data_dir}': {METADATA_FILE} has no image_id and dx columns (found "
            f"{header[:6]}); re-download it")


def check_output_dir(output_dir: str) -> None:
    """``output-dir`` is, or can become, a folder this process can write into.

    Creates nothing that stays: a probe file goes into the deepest folder that exists
    (``output-dir`` itself, or the ancestor it would be created in) and is removed.
    """
    target = Path(output_dir).expanduser().absolute()
    existing = target
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == target else f"has a file where a folder goes ({existing})"
        raise PreflightError(
            f"output-dir='{output_dir}' {what}: choose another output-dir (--output-dir DIR) "
            "or move that file")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gems-fl-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PreflightError(
            f"output-dir='{output_dir}' is not writable ({exc.strerror or exc} in {existing}): "
            "choose a folder you can write (--output-dir DIR)") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())
