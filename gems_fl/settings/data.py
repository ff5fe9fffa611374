"""Settings of the data: which dataset, where its files are, how it is divided among
the nodes, and the shape of a site's own files.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass

from gems_fl.data.agreement import AUTO_STANDARDIZE, NODE_FILES, STANDARDIZE_CHOICES
from gems_fl.data.categories import MAX_LEVELS, parse_categories
from gems_fl.data.datasets import DATASET_NAMES
from gems_fl.settings.checks import at_least, in_range, one_of, parses, positive, setting
from gems_fl.settings.values import check_classes

_ROW_HAM10000_PER_CLASS = (
    "HAM10000: images per class after balancing (the paper's 2000) and training epochs of "
    'the feature CNN')


@dataclass(frozen=True)
class DataSettings:
    """Where the data comes from and how it is divided."""

    dataset: str = setting(
        'digits',
        '`digits` (scikit-learn, bundled), `fashion-mnist` or `mnist` (IDX files), `cifar10` '
        '(VGG-16 features), `ham10000` (CNN features), or `node-files` (each SuperNode\'s '
        'own file, any features and classes; docs/own-data.md)',
        one_of((*DATASET_NAMES, NODE_FILES)), node=True, user=True,
        detail='CIFAR-10 reads the python batches, HAM10000 the metadata CSV and JPEGs '
        '(docs/datasets.md); `node-files` agrees on features and classes in the identity round')
    data_dir: str = setting(
        '',
        'folder of the IDX files; empty: `/usr/share/datasets/fashion-mnist` for '
        'Fashion-MNIST (Debian package `dataset-fashion-mnist`); required for MNIST '
        '(torchvision downloads it there when online), CIFAR-10 and HAM10000',
        node=True, user=True)
    site_files: str = setting(
        '',
        "`gems-fl run --site FILE ...`: a simulation's nodes on site files, comma-separated "
        "paths; node `k` (partition-id) reads file `k` as its `data-path` and is named by its "
        "stem. A node with its own `data-path` (a deployed SuperNode) ignores it",
        node=True, user=True)
    label_division: str = setting(
        'paper',
        '`paper` (the appendix table, K = 2, 3, 5), `classes-per-node:N`, `iid`, '
        '`dirichlet:ALPHA` (each class split over the nodes by a Dirichlet(ALPHA) draw, '
        'seeded; `dirichlet:ALPHA:MIN`: every node at least MIN samples, default 10), or '
        'explicit groups such as `0,1/2,3/4,5/6,7/8,9`',
        node=True, user=True)
    allow_overlap: bool = setting(
        False,
        'an explicit `label-division` may give a class to several nodes (its samples are '
        'split among them); otherwise that is refused before the run starts, as a likely '
        'typo', lab=True)
    num_features: int = setting(
        0,
        "`dataset='node-files'`: the number of features every node's file must have; 0: "
        'the count most nodes report in the identity round (nodes with another count are '
        'left out and named)',
        at_least(0, "0: agreed from what the nodes report"), node=True, user=True)
    classes: str = setting(
        '',
        "`dataset='node-files'`: the class labels, as comma-separated names "
        "(`'benign,malignant'`, in index order) or a count (`3`: labels `0..2`, or the 3 "
        'names most nodes hold); empty: every label the nodes hold, sorted (numerically '
        'when all are integers)',
        parses(check_classes), node=True, user=True)
    label_column: str = setting(
        '',
        "CSV files (nodes and `public-data`): the label's column, as a 0-based number "
        '(negative counts from the end) or a header name; empty: the last column',
        node=True, user=True)
    val_fraction: float = setting(
        0.2,
        "a site file without validation rows (no `<stem>_val.csv`, no `x_val`): the share of "
        "its training rows its node sets aside, per class and seeded, to build its space and "
        "check `h_G`",
        in_range(0.0, 1.0, "a share of the training rows", closed="neither"), node=True,
        detail="Measured on Fashion-MNIST sites given no validation rows "
        "(results/benchmarks/val_fraction.json, `python3 benchmarks/val_fraction.py`)")
    id_columns: str = setting(
        'auto',
        "columns that number rows rather than measure them, left out of the features: `auto` "
        "(a text column whose values differ in every row, or one named like an ID, `id`, "
        "`rownames`, `*_id`, whose values differ in every row), `none` (keep every column), or "
        "header names `'patient,visit'` (left out besides those `auto` finds)",
        node=True)
    categories: str = setting(
        '',
        f"category columns (a text column of at most {MAX_LEVELS} values, one 0/1 column per "
        "value) are agreed by name in the identity round: every value some site holds. "
        "Declare them instead as `'plan=basic|premium; region=north|south'`; required under "
        "`dp-epsilon` (a site's values would reach the server unnoised)",
        parses(parse_categories), node=True)
    standardize: str = setting(
        'auto',
        "feature scaling: `auto` (`ranges` with `feature-ranges`, else `federated` for "
        "`node-files`, else `off`), `off`, `node` (each node its own mean and std), "
        "`federated` (one mean and std for all, from each node's per-feature sums; no row "
        "leaves a node) or `ranges` (the declared `feature-ranges`)",
        detail="`auto` is `federated` for sites' own files (measured first on held-out "
        'sites: results/benchmarks/standardize.json) and `off` for a named dataset (its '
        'loader scales it). Under `dp-epsilon` the federated sums would leave a node '
        'unnoised: `auto` is then `ranges` with `feature-ranges`, else `off` (scale the files '
        'beforehand)',
        check=one_of((AUTO_STANDARDIZE, *STANDARDIZE_CHOICES)), node=True, user=True)
    feature_ranges: str = setting(
        '',
        'a CSV file on the server, header `feature,min,max`, one row per feature (named as '
        "in the sites' headers, or numbered from 0): every site maps [min, max] to [-1, 1]. "
        'Known without the rows, it spends no privacy: the scaling for `dp-epsilon` runs',
        user=True)
    min_rows: int = setting(
        10,
        "`dataset='node-files'`: a site with fewer training rows than this is left out at "
        'the identity round, named with the reason (too few rows to train and check a '
        'model); with the default `required-nodes=all` the run then stops before any '
        "training. A named dataset's division checks its own sizes",
        at_least(1, "a site needs a training row"))
    public_data: str = setting(
        '',
        'a file on the server (`.npz` with `x`, `y` and optionally `x_test`, `y_test`; or '
        '`.csv`, with `<stem>_test.csv` optional): its test split is the server\'s test set; '
        'with `baselines=\'all\'` GEMS tuned and Raw train on its rows. Empty: off', user=True,
        detail='Without a server test set the nodes evaluate the tuned models too. A test '
        'split alone (`.npz` with `x_test`, `y_test` only, or a `<stem>_test.csv`) is the '
        'server\'s test set, with no tuning. Read and checked before any node is contacted')
    vgg16_weights: str = setting(
        '',
        "CIFAR-10: a local VGG-16 state dict (torchvision's `vgg16-397923af.pth`); empty: "
        'torchvision fetches `VGG16_Weights.IMAGENET1K_V1` (needs torchvision and internet)',
        node=True, lab=True)
    feature_cache_dir: str = setting(
        '',
        "where extracted CIFAR-10 / HAM10000 features (and HAM10000's decoded images) are "
        'cached; empty: `~/.cache/gems-fl/features` (`$XDG_CACHE_HOME/gems-fl/features` '
        'when set)',
        node=True, lab=True)
    ham10000_per_class: int = setting(
        2000,
        _ROW_HAM10000_PER_CLASS,
        at_least(4, "every class needs an image in each of train, public, val and test"), node=True, lab=True)
    ham10000_cnn_epochs: int = setting(
        10,
        _ROW_HAM10000_PER_CLASS,
        positive, node=True, lab=True)
