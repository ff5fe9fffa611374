"""Run settings: one declaration per setting, one validated object built from them.

Every key of ``[tool.flwr.app.config]`` in ``pyproject.toml`` is one field of
:class:`Settings` (``-`` becomes ``_``), declared with :func:`setting`: its default
(hence its type), its meaning, its constraint, and whether nodes need it. From those
declarations come the validation (:meth:`Settings.from_run_config` stops a bad
``--run-config`` at the start with a message naming the key), ``gems-fl run --help``,
the README's "Settings" table (:mod:`gems_fl.settings_doc`, checked by a test), and what a
node receives (:meth:`Settings.for_nodes`: only the settings node code reads).
"""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping

from gems_fl.data.agreement import NODE_FILES, STANDARDIZE_CHOICES
from gems_fl.data.datasets import DATASET_NAMES
from gems_fl.geometry.choices import (
    DEFAULT_REFINE_L2,
    CLASS_GRAMS,
    ELLIPSOID_FLOORS,
    GRAM_POINTS,
    GRAM_WEIGHTINGS,
    NO_INTERSECTION_FALLBACKS,
    POOLED_RIDGES,
    REFINE_METHODS,
    SERVER_GRAMS,
    SPACE_KINDS,
    SUMS_ABOVE_NODES,
)
from gems_fl.learning.recipe import (TUNE_LAYERS, TUNE_STOPS, LocalTraining, TrainRecipe,
                                     TuneRecipe)
from gems_fl.learning.widths import parse_hidden
from gems_fl.setting_checks import (
    SettingsError,
    at_least,
    coerce,
    in_range,
    key_of,
    non_empty,
    one_of,
    parses,
    positive,
    setting,
)
from gems_fl.setting_rules import check_rules
from gems_fl.setting_values import (
    check_classes,
    check_hidden,
    parse_gram_rank,
    run_gram_rank,
    parse_pooled_ridge,
    parse_refine_l2,
    parse_required_nodes,
    parse_tune_curve,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Settings", "SettingsError", "node_keys"]

#: Paths only a partitioned dataset's nodes read (the files a simulation cuts into
#: partitions); nodes on their own files (``node-files``) never receive them.
PARTITION_PATHS = ("data-dir", "feature-cache-dir", "vgg16-weights")

# What `hidden = "auto"` means per dataset (the paper: 100 for CIFAR-10, 50 otherwise).
AUTO_HIDDEN = {"cifar10": "100"}
AUTO_HIDDEN_DEFAULT = "50"
MODELS = ("logistic", "mlp")
NEURON_CRITERIA = ("rms", "paper")
DEVICES = ("auto", "cpu", "cuda")  # resolved per process: gems_fl.learning.train.resolve_device
# the run settings a node's own --node-config may override
NODE_OVERRIDES = ("eps", "local-max-epochs", "local-patience")


_ROW_HIDDEN = (
    'MLP hidden widths (`"100,50"` for two layers) and dropout after each hidden layer; '
    "`auto` is the paper's width for the dataset: `100` for `cifar10`, `50` for every other")
_ROW_LOCAL_LR = (
    'Adam learning rate and batch size for all training')
_ROW_LOCAL_MAX_EPOCHS = (
    'training stops when for `local-patience` epochs neither the training accuracy reached '
    'a new best nor the loss fell by 1e-3; at most `local-max-epochs`. A site may set its '
    'own budget with `--node-config "local-max-epochs=50 local-patience=5"`')
_ROW_TUNE_EPOCHS = (
    'fine-tuning recipe, also used for Raw')
_ROW_HAM10000_PER_CLASS = (
    "HAM10000: images per class after balancing (the paper's 2000) and training epochs of "
    'the feature CNN')

@dataclass(frozen=True)
class Settings:
    """Validated run settings (see README.md, "Settings").

    ``scope="node"`` builds what a node holds: the settings it received
    (:meth:`for_nodes`), validated; the server-only ones are ``None`` there, so node
    code that reads one fails loudly instead of using a default the operator never set.
    """

    dataset: str = setting(
        'digits',
        '`digits` (scikit-learn, bundled), `fashion-mnist` (IDX files), `mnist` (IDX '
        'files), `cifar10` (python batches, VGG-16 features), `ham10000` (metadata CSV + '
        "JPEGs, CNN features), or `node-files` (each SuperNode's own file, any features "
        'and classes, agreed in the identity round); see "CIFAR-10", "HAM10000" and "Your '
        'own data" below',
        one_of((*DATASET_NAMES, NODE_FILES)), node=True)
    data_dir: str = setting(
        '',
        'folder of the IDX files; empty: `/usr/share/datasets/fashion-mnist` for '
        'Fashion-MNIST (Debian package `dataset-fashion-mnist`); required for MNIST '
        '(torchvision downloads it there when online), CIFAR-10 and HAM10000',
        node=True)
    site_files: str = setting(
        '',
        "`gems-fl run --site FILE ...`: a simulation's nodes on site files, comma-separated "
        "paths; node `k` (partition-id) reads file `k` as its `data-path` and is named by its "
        "stem. A node with its own `data-path` (a deployed SuperNode) ignores it",
        node=True)
    label_division: str = setting(
        'paper',
        '`paper` (the appendix table, K = 2, 3, 5), `classes-per-node:N`, `iid`, '
        '`dirichlet:ALPHA` (each class split over the nodes by a Dirichlet(ALPHA) draw, '
        'seeded; `dirichlet:ALPHA:MIN`: every node at least MIN samples, default 10), or '
        'explicit groups such as `0,1/2,3/4,5/6,7/8,9`',
        node=True)
    model: str = setting(
        'logistic',
        '`logistic` (convex, one round) or `mlp` (layer-wise protocol, one round per '
        'hidden layer plus one)',
        one_of(MODELS), node=True)
    hidden: str = setting(
        'auto',
        _ROW_HIDDEN,
        parses(check_hidden), node=True)
    dropout: float = setting(
        0.5,
        _ROW_HIDDEN,
        in_range(0.0, 1.0, "a fraction of units", closed="left"), node=True)
    eps_neuron: float = setting(
        0.1,
        "eps_j: a perturbed neuron is good enough while its outputs on the node's "
        'validation inputs deviate by at most this',
        positive, node=True)
    neuron_criterion: str = setting(
        'rms',
        "deviation of a neuron's outputs: `rms` (root mean square) or `paper` (L2 norm "
        "divided by N, the paper's eq. 3)",
        one_of(NEURON_CRITERIA), node=True)
    neuron_delta: float = setting(
        0.01,
        'bisection width of the per-neuron radius search',
        positive, node=True)
    clusters: int = setting(
        75,
        'm_eps, k-means clusters over all neurons of all nodes',
        positive)
    tune_layers: str = setting(
        'auto',
        "MLP fine-tuning: the `last` layer only (the paper's choice), `all`, or `auto`: "
        'both, keeping the one that scores better on the held-out 20 % (with `tune-stop=fixed`, '
        'which holds nothing out: `last`)',
        one_of(TUNE_LAYERS))
    tune_curve: str = setting(
        '',
        'Fine-tuning study: comma-separated public sample sizes (e.g. `100,200,500`); the '
        'server then tunes GEMS, each Local model, Averaged and a fresh Raw model '
        'identically on nested samples of each size and writes the curve to `results.json` '
        '(`fine_tuning`). Empty: off',
        parses(parse_tune_curve))
    space: str = setting(
        'gram',
        '`gram` (logit-space ellipsoid, see "Good-enough spaces"; the default), or the '
        "paper's `ball` or `ellipsoid` (Fisher axes, appendix A)",
        one_of(SPACE_KINDS), node=True)
    gram_rank: int | str = setting(
        'auto',
        "`gram` only: how a node's Gram matrix travels. 0: the whole matrix (upper triangle, "
        'float32; exact). r > 0: a rank-r factor `F` (float16 vectors, power-of-two scales) '
        'and the diagonal of the rest, `G ~ F F^T + diag(G - F F^T)` (fewer bytes, a coarser '
        'space). `auto` (the default): rank r = max(32, ceil(size / 16)) (50 for 784 features) '
        'where the matrix is larger than 2 r + 1, else the whole matrix (digits travels whole); '
        'the whole matrix under secure-aggregation and DP, which sum it whole anyway, and for the '
        'MLP, whose output layer lost up to 1.1 points with it (set a rank to compress it). README '
        '"Compressed Gram replies" has the bytes against accuracy',
        parses(parse_gram_rank), node=True)
    gram_ridge: float = setting(
        1e-06,
        '`gram` only: ridge added to the weighted sum of Gram matrices in the closed-form '
        'center (relative to one mean Gram matrix)',
        at_least(0))
    gram_weighting: str = setting(
        'samples',
        "`gram` only: lambda_k in the center, `samples` (the node's training-sample count) "
        'or `radius` (1 / rho_k^2)',
        one_of(GRAM_WEIGHTINGS))
    gram_point: str = setting(
        'auto',
        '`gram` only: `auto` (the default) lets the selection round choose, on the nodes\' '
        'validation data, among `pooled`, `lda`, `gaussian` (where the nodes sent class Gram '
        'matrices, `class-grams`), `mixture` (where they sent them per k-means component, '
        '`class-components`) and `closed-form` (see "Good-enough spaces"); '
        '`pooled` is the ridge least-squares classifier of all nodes\' data, from their Gram '
        'matrices and label moments; `lda` the linear discriminant of the same sums (class '
        'means and shared within-class covariance, shrinkage from `pooled-ridge`); `gaussian` '
        'the softmax layer fitted to virtual rows drawn from each class\'s pooled mean and '
        'covariance (CCVR; needs class Gram matrices; L2 1e-6, or chosen among 1e-6, 1e-5, '
        '1e-4 and 1e-3 with `pooled-ridge=auto`); `mixture` the same fit to virtual rows '
        'of every node\'s k-means components of each class (`class-components`), a mixture '
        'of Gaussians per class; `best` the '
        'best pooled fit inside every node\'s space '
        '(the pooled point when they share none); `closed-form` the weighted center of the '
        'spaces (RegMean); `shared` the point minimising the largest scaled distance when '
        'the center misses a space and that point lies in all of them',
        one_of(GRAM_POINTS))
    server_grams: str = setting(
        'auto',
        "`gram`, logistic model: what the server keeps of the nodes' Gram matrices. `nodes`: "
        "every node's matrix (the server checks h_G against every space itself). `sums`: only "
        'the sums the closed-form, pooled, LDA and gaussian points need (class Gram matrices '
        'summed per class), added in as each reply is decoded, so memory does not grow with '
        'the number of nodes; each node then checks h_G against its own space in the '
        'evaluate round. `sums` needs gram-point `auto`, `pooled`, `lda`, `gaussian` or '
        '`closed-form` and gram-weighting `samples`. `auto`: `sums` above '
        f'{SUMS_ABOVE_NODES} nodes where the settings allow it, else `nodes`',
        one_of(SERVER_GRAMS))
    secure_aggregation: bool = setting(
        False,
        '`gram`, logistic model: every per-node statistic the point needs (Gram matrix, '
        "`W_k G_k`, label moments, class counts) travels through Flower's SecAgg+, so the "
        'ServerApp holds only their sums; nodes send no model, and each checks h_G against '
        'its own space (README "Secure aggregation"). Needs gram-point `auto`, `pooled`, '
        '`lda` or `closed-form` and refine-rounds=0')
    secure_threshold: float = setting(
        0.5,
        '`secure-aggregation`: the share of each node\'s SecAgg+ key shares needed to '
        'reconstruct it (SecAgg+ `reconstruction_threshold`); nodes that drop out are '
        'tolerated while every node keeps this share of its neighbours',
        in_range(0.0, 1.0, 'a share of the key shares', closed='right'))
    dp_epsilon: float = setting(
        0.0,
        '`gram`, logistic model: differential privacy. Each node adds Gaussian noise to the '
        'sums over its training rows (Gram matrix and label moments, rows clipped to '
        '`dp-clip`) before they leave it, calibrated so the release is (`dp-epsilon`, '
        '`dp-delta`)-DP for one replaced row; it sends no model. The server solves the pooled '
        'and LDA points from the noised sums (README "Differential privacy"). 0: off',
        at_least(0, "0: no differential privacy"), node=True)
    dp_delta: float = setting(
        1e-5,
        '`dp-epsilon`: the delta of the (epsilon, delta) guarantee each node\'s release keeps',
        in_range(0.0, 1.0, 'a probability', closed='neither'), node=True)
    dp_clip: float = setting(
        5.0,
        '`dp-epsilon`: each training row\'s features are scaled down to this L2 norm at most '
        'before the sums (the bias input stays 1), which bounds one row\'s influence; in the '
        'features\' units (after `standardize`). 5: of 1, 2, 3, 5, 10 and 15, the best mean '
        'pooled validation accuracy over epsilon 1 and 8 on Fashion-MNIST '
        '(benchmarks/dp_clip.py, 2 seeds; at epsilon 1 alone, 2 was 1 point better)',
        positive, node=True)
    dp_seeded_noise: bool = setting(
        False,
        '`dp-epsilon`: draw the noise from the run\'s seed (repeatable experiments) instead '
        "of the operating system's entropy. A server that knows the seed can subtract the "
        'noise: no privacy against it',
        node=True)
    label_moments: bool = setting(
        True,
        '`gram` only: nodes also send their label moments (mean of `e_y [x, 1]^T` over their '
        'training rows, one model\'s size) and class counts; `gram-point` `auto`, `pooled` '
        'and `best` need them',
        node=True)
    class_grams: str = setting(
        'auto',
        '`gram` with `label-moments`: nodes also send the Gram matrix of each class they hold '
        '(mean of `x~ x~^T` over its rows), from which the server fits the `gaussian` point. '
        'Up to 256 inputs whole (float32); above, with `gram-rank` above 0 or `auto`, each '
        'class\'s covariance as `gram-rank`\'s rank-r factor (float16) and the diagonal of the '
        'rest, the mean from the label moments (82 KB per class at 784 pixels, rank 50: 341,080 against 177,185 bytes per node of 2 classes). '
        '`auto` (the default): wherever one of those forms applies, and whenever '
        '`gram-point=gaussian`; not for layers above 256 inputs with `gram-rank=0`, where '
        'each class would send a whole 1.2 MB matrix (`true` sends them). Not with '
        '`secure-aggregation` or `dp-epsilon`',
        one_of(CLASS_GRAMS), node=True)
    class_components: int = setting(
        4,
        '`class-grams` sent whole (up to 256 inputs: the MLP\'s output layer): each node '
        'splits the rows of each class it holds into up to this many k-means clusters (of '
        'at least 50 rows and twice the layer\'s size each) and sends one Gram matrix per '
        'cluster with its row count; the `mixture` point draws its virtual rows from them, '
        'a mixture of Gaussians per class, and `gaussian` adds them up (README "Good-enough '
        'spaces"). The factor form (above 256 inputs) sends one per class; with '
        '`server-grams=sums` the server adds a class\'s clusters up. 1: one per class',
        at_least(1, "1: one Gram matrix per class"), node=True)
    refine_rounds: int = setting(
        0,
        '`gram`: R steps after the one-shot `h_G` (the logistic model, or the MLP\'s output '
        'layer on the merged hidden layers), which the selection round '
        'first scales by the logit scale with the lowest pooled validation cross-entropy; '
        'in each step every node sends its cross-entropy gradient at the current model '
        '(model-sized) and the server steps with the Gram matrices it holds as curvature '
        '(`refine-method`; Bohning 1992). 0: one-shot',
        at_least(0))
    refine_method: str = setting(
        'secant',
        '`refine-rounds`: `secant` divides each Bohning step by the curvature the objective '
        'showed along the last one, keeps a point only when the pooled objective the nodes '
        'report there did not rise, and otherwise goes back with a plain step; `monotone` '
        'takes plain Bohning steps from the current model (the pooled objective never '
        'increases); `accelerated` sends Nesterov\'s extrapolation and steps from there, '
        'restarting the momentum when the pooled objective rises',
        one_of(REFINE_METHODS))
    refine_l2: float | str = setting(
        'auto',
        '`refine-rounds`: the objective the steps minimise is the pooled cross-entropy plus '
        '`l2 / 2` times the squared norm of `W`, `l2` relative to the mean diagonal of the '
        'pooled Gram matrix (the server adds it; replies do not change); 0: the plain pooled '
        f'loss. `auto`: {DEFAULT_REFINE_L2:g} for the logistic model (the best pooled '
        "validation accuracy, README \"Refinement rounds\"), 0 for the MLP's output layer "
        '(not chosen there; that penalty lowered it in the run measured)',
        parses(parse_refine_l2))
    pooled_ridge: str = setting(
        'auto',
        '`gram-point` `auto`, `pooled` and `best`: ridge of the pooled least-squares fit, '
        'relative to one mean Gram matrix; `auto` lets the nodes choose it: a selection round '
        'after the spaces sends the point for each of '
        + ', '.join(f'{r:g}' for r in POOLED_RIDGES)
        + ' and keeps the one with the best pooled validation accuracy',
        parses(parse_pooled_ridge))
    ellipsoid_floor: str = setting(
        'quantile',
        'ellipsoid axes `max(F_ref / F_i, c)`: `quantile` takes F_ref as the 5 % quantile '
        "of the nonzero Fisher entries; `paper` is appendix A's min over all entries, "
        'which collapses every axis to c when some entry is 0',
        one_of(ELLIPSOID_FLOORS), node=True)
    eps: float = setting(
        0.4,
        'Q: a model is good enough on a node when its validation accuracy is >= eps. A '
        'node may set its own with `--node-config "eps=0.6"`',
        in_range(0.0, 1.0, "a target accuracy between 0 and 1"), node=True)
    num_directions: int = setting(
        500,
        'p, surface samples per tested radius',
        positive, node=True)
    r_max: float = setting(
        0.0,
        'upper end of the radius bisection, in the units of the space kind\'s radius; 0: the '
        'kind\'s own bound (see "Good-enough spaces")',
        at_least(0, "0: the space kind's own bound"), node=True)
    delta: float = setting(
        0.01,
        'bisection stops at this width',
        positive, node=True)
    ellipsoid_c: float = setting(
        0.1,
        'c of appendix A: shortest axis relative to the longest',
        in_range(0, 1, "it is the shortest ellipsoid axis relative to the longest (appendix A's c)", closed="right"), node=True)
    seed: int = setting(
        0,
        'seeds splits, partitions, initialisation, directions, public sample',
        at_least(0), node=True)
    local_lr: float = setting(
        0.001,
        _ROW_LOCAL_LR,
        positive, node=True)
    batch_size: int = setting(
        32,
        _ROW_LOCAL_LR,
        positive, node=True)
    local_max_epochs: int = setting(
        100,
        _ROW_LOCAL_MAX_EPOCHS,
        positive, node=True)
    local_patience: int = setting(
        3,
        _ROW_LOCAL_MAX_EPOCHS,
        positive, node=True)
    public_samples: int = setting(
        1000,
        "size of the server's public sample (0: no tuning, no Raw)",
        at_least(0, "0 turns fine-tuning and the Raw baseline off"))
    tune_epochs: int = setting(
        5,
        _ROW_TUNE_EPOCHS,
        at_least(0))
    tune_lr: float = setting(
        0.001,
        _ROW_TUNE_EPOCHS,
        positive)
    tune_stop: str = setting(
        'holdout',
        'how fine-tuning (GEMS tuned, Raw, the fine-tuning study) stops: `holdout` holds out '
        '20 % of the public sample, picks there the epoch (the start included; at most '
        '`tune-max-epochs`, ended by 5 epochs in which neither held-out accuracy nor loss '
        'improved) and, for a trained start, the factor it is shrunk by first (1, 0.5, 0.2 '
        'or 0), then tunes that long on the whole sample; '
        "`fixed` runs exactly `tune-epochs` epochs on all of it (the paper's recipe)",
        one_of(TUNE_STOPS))
    tune_max_epochs: int = setting(
        50,
        '`tune-stop=holdout`: at most this many fine-tuning epochs',
        at_least(0))
    min_replies: int = setting(
        2,
        'fewer valid replies than this stops the run with an error',
        positive)
    required_nodes: str = setting(
        'all',
        'which sites must take part to the end, else the run exits non-zero (results are '
        'still written, status `incomplete`): `all` (every node present at the identity '
        'round), a count (`0`: none), or node names (`site-a,site-b`)',
        lambda key, value: parse_required_nodes(value))
    no_intersection: str = setting(
        'min-penalty',
        "fallback when the spaces do not intersect: `min-penalty` (minimise the paper's "
        'objective) or `mean`',
        one_of(NO_INTERSECTION_FALLBACKS))
    evaluate_on_server: bool = setting(
        True,
        'the server loads the dataset for Global, Raw and the test set; set `false` where '
        'it holds no data')
    output_dir: str = setting(
        'gems-results',
        'results go to `<output-dir>/run-<run id>/`',
        non_empty("output-dir must name a folder, e.g. 'gems-results'"))
    vgg16_weights: str = setting(
        '',
        "CIFAR-10: a local VGG-16 state dict (torchvision's `vgg16-397923af.pth`); empty: "
        'torchvision fetches `VGG16_Weights.IMAGENET1K_V1` (needs torchvision and internet)',
        node=True)
    feature_cache_dir: str = setting(
        '',
        "where extracted CIFAR-10 / HAM10000 features (and HAM10000's decoded images) are "
        'cached; empty: `~/.cache/gems-fl/features` (`$XDG_CACHE_HOME/gems-fl/features` '
        'when set)',
        node=True)
    ham10000_per_class: int = setting(
        2000,
        _ROW_HAM10000_PER_CLASS,
        at_least(4, "every class needs an image in each of train, public, val and test"), node=True)
    ham10000_cnn_epochs: int = setting(
        10,
        _ROW_HAM10000_PER_CLASS,
        positive, node=True)
    round_timeout: float = setting(
        1800.0,
        "seconds the server waits for the replies of one round; also each message's TTL, "
        'so work for a slow or dead node is dropped, not left queued',
        positive)
    allow_overlap: bool = setting(
        False,
        'an explicit `label-division` may give a class to several nodes (its samples are '
        'split among them); otherwise that is refused before the run starts, as a likely '
        'typo')
    device: str = setting(
        'auto',
        'where local training, fine-tuning and feature extraction run: `auto` (CUDA when '
        'the process sees one, else CPU), `cpu`, or `cuda` (an error where there is no '
        'CUDA device); radius searches and the layer merge stay on the CPU',
        one_of(DEVICES), node=True)
    max_width: int = setting(
        0,
        'MLP: the most neurons a merged hidden layer may have (0: no bound). Above it, the '
        'neurons that merged with no other are clustered by k-means and each cluster keeps '
        'its member nearest the center, so every output neuron lies in some node\'s neuron '
        'space; the others are reported as dropped. 450 kept N=20 within 0.6 point of the '
        'unbounded merge (README "Speed and scale")',
        at_least(0, "0: no bound on the merged width of a hidden layer"))
    num_features: int = setting(
        0,
        "`dataset='node-files'`: the number of features every node's file must have; 0: "
        'the count most nodes report in the identity round (nodes with another count are '
        'left out and named)',
        at_least(0, "0: agreed from what the nodes report"), node=True)
    classes: str = setting(
        '',
        "`dataset='node-files'`: the class labels, as comma-separated names "
        "(`'benign,malignant'`, in index order) or a count (`3`: labels `0..2`, or the 3 "
        'names most nodes hold); empty: every label the nodes hold, sorted (numerically '
        'when all are integers)',
        parses(check_classes), node=True)
    label_column: str = setting(
        '',
        "CSV files (nodes and `public-data`): the label's column, as a 0-based number "
        '(negative counts from the end) or a header name; empty: the last column',
        node=True)
    standardize: str = setting(
        'off',
        'feature scaling before training and evaluation: `off`, `node` (each node its own '
        'training mean and std), or `federated` (one mean and std for all, combined on the '
        "server from each node's per-feature count, sum and sum of squares sent in the "
        'identity round; no rows leave a node)',
        one_of(STANDARDIZE_CHOICES), node=True)
    public_data: str = setting(
        '',
        'a file on the server (`.npz` with `x`, `y` and optionally `x_test`, `y_test`; or '
        '`.csv`, with `<stem>_test.csv` optional) to fine-tune GEMS and train Raw on; '
        'without a server test set the nodes evaluate those models too. A test split alone '
        '(`.npz` with `x_test`, `y_test` only, or a `<stem>_test.csv`) is the server\'s test '
        'set, with no tuning. Read and checked before any node is contacted. Empty: off')

    scope: InitVar[str] = "run"

    def __post_init__(self, scope: str) -> None:
        node_only = scope == "node"
        if self.hidden.strip().lower() == "auto":
            object.__setattr__(self, "hidden", AUTO_HIDDEN.get(self.dataset, AUTO_HIDDEN_DEFAULT))
        # "auto", or the rank as an int whether it came as 50 or "50" (--run-config)
        object.__setattr__(self, "gram_rank", run_gram_rank(self))
        object.__setattr__(self, "refine_l2", parse_refine_l2(self.refine_l2))
        for f in fields(self):
            value = getattr(self, f.name)
            if node_only and not f.metadata["node"]:
                if value != f.default:
                    raise SettingsError(f"{key_of(f)} is a server-side setting; nodes do not "
                                        "receive it")
                object.__setattr__(self, f.name, None)
                continue
            if f.metadata["check"] is not None:
                f.metadata["check"](key_of(f), value)
        check_rules(self, node_only)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "Settings":
        """Build settings from a Flower run config (keys as in ``pyproject.toml``).

        Unknown keys are ignored (Flower passes the whole app config); each known key
        must have the type of its default.
        """
        return cls(**_known(run_config))

    @classmethod
    def from_node_config(cls, config: Mapping[str, Any]) -> "Settings":
        """What a node holds: the settings of a message (:meth:`for_nodes`), validated."""
        return cls(**_known(config, node_only=True), scope="node")

    def for_node(self, node_config: Mapping[str, Any]) -> "Settings":
        """These settings with the node's own overrides (keys in ``NODE_OVERRIDES``).

        A node may choose its own target accuracy: ``--node-config "eps=0.6"`` (the
        paper's intersection analysis gives each node a different eps), and its own
        training budget (``local-max-epochs``, ``local-patience``: a site with little
        compute caps its training).
        """
        kwargs = {key.replace("-", "_"): coerce(key, node_config[key], getattr(self, key.replace("-", "_")))
                  for key in NODE_OVERRIDES if key in node_config}
        if not kwargs:
            return self
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["node"]}
        return type(self)(**{**values, **kwargs}, scope="node")

    @property
    def hidden_widths(self) -> list[int]:
        """Configured hidden widths of the MLP (``hidden`` parsed)."""
        return parse_hidden(self.hidden)

    @property
    def pooled_ridges(self) -> tuple[float, ...]:
        """The pooled ridges to use (``pooled-ridge`` parsed): one, or the candidates of
        the selection round for ``auto``."""
        return parse_pooled_ridge(self.pooled_ridge, private=bool(self.dp_epsilon))

    @property
    def tune_sizes(self) -> list[int]:
        """Public sample sizes of the fine-tuning study (``tune-curve`` parsed)."""
        return parse_tune_curve(self.tune_curve)

    @property
    def local_recipe(self) -> TrainRecipe:
        """How every model trained to convergence is trained (local, Global, Raw converged)."""
        return TrainRecipe(lr=self.local_lr, batch_size=self.batch_size,
                           max_epochs=self.local_max_epochs, patience=self.local_patience)

    @property
    def tune_recipe(self) -> TuneRecipe:
        """How GEMS tuned, Raw and every model of the fine-tuning study are tuned."""
        return TuneRecipe(epochs=self.tune_epochs, lr=self.tune_lr, batch_size=self.batch_size,
                          stop=self.tune_stop, max_epochs=self.tune_max_epochs)

    @property
    def local_training(self) -> LocalTraining:
        """How local models are built and trained (``model``, ``hidden``, ``dropout``, recipe)."""
        return LocalTraining(self.model, tuple(self.hidden_widths), self.dropout,
                             self.local_recipe)

    def new_model(self, num_features: int, num_classes: int) -> "nn.Module":
        """A fresh model of the configured kind (``model``, ``hidden``, ``dropout``)."""
        return self.local_training.new_model(num_features, num_classes)

    def to_config(self) -> dict[str, Any]:
        """Settings as a flat ``{key: value}`` dict with ``pyproject.toml`` keys."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}

    def for_nodes(self) -> dict[str, Any]:
        """The settings node code reads, as ``{key: value}``: what every message carries.
        With ``dataset='node-files'`` each node reads its own file, so the server's data
        paths (:data:`PARTITION_PATHS`) stay on the server."""
        out = {key_of(f): getattr(self, f.name) for f in fields(self) if f.metadata["node"]}
        if self.gram_point in ("gaussian", "mixture") and self.class_grams == "auto":
            out["class-grams"] = "true"  # the point needs them whatever the layer's size
        if self.dataset == NODE_FILES:
            for key in PARTITION_PATHS:
                out.pop(key, None)
        return out


def node_keys() -> tuple[str, ...]:
    """The keys of the settings nodes receive."""
    return tuple(key_of(f) for f in fields(Settings) if f.metadata["node"])


def _known(config: Mapping[str, Any], node_only: bool = False) -> dict[str, Any]:
    return {f.name: coerce(key_of(f), config[key_of(f)], f.default) for f in fields(Settings)
            if key_of(f) in config and (f.metadata["node"] or not node_only)}
