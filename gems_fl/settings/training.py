"""Settings of training: the model, how local models are trained, and how the
server fine-tunes on its public sample.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass

from gems_fl.data.random_features import MAPS
from gems_fl.learning.model_kinds import LOGISTIC_KIND, MODEL_KINDS
from gems_fl.learning.recipe import LOCAL_SOLVES, TUNE_LAYERS, TUNE_STOPS
from gems_fl.settings.checks import at_least, in_range, one_of, parses, positive, setting
from gems_fl.settings.values import check_hidden, parse_rf_bandwidth, parse_tune_curve

DEVICES = ("auto", "cpu", "cuda")  # resolved per process: gems_fl.learning.train.resolve_device

_ROW_HIDDEN = (
    'MLP hidden widths (`"100,50"` for two layers) and dropout after each hidden layer; '
    "`auto` is the paper's width for the dataset: `100` for `cifar10`, `50` for every other")

_ROW_RF = (
    "`model='random-features'`: the map, `fourier` (`sqrt(2/D) cos(x W / s + b)`, the "
    "Gaussian kernel's random features) or `relu` (`sqrt(2/D) max(0, x W / s + b)`), and its "
    "width D; the Gram statistics are (D + 1) square (docs/random-features.md)")

_ROW_LOCAL_LR = (
    'Adam learning rate and batch size for all training by epochs (the MLP; a convex model '
    'under `local-solve=adam`)')

_ROW_LOCAL_MAX_EPOCHS = (
    'training stops when for `local-patience` epochs neither the training accuracy reached '
    'a new best nor the loss fell by 1e-3; at most `local-max-epochs`. A site may set its '
    'own budget with `--node-config "local-max-epochs=50 local-patience=5"`')

_ROW_TUNE_EPOCHS = (
    'fine-tuning recipe, also used for Raw')


@dataclass(frozen=True)
class TrainingSettings:
    """What is trained and how."""

    model: str = setting(
        LOGISTIC_KIND.name,
        '`logistic`, `random-features` (on a random-feature map of the inputs; '
        'docs/random-features.md), `kernel` (on the rows beside Nyström features of the RBF '
        'kernel; docs/kernel.md) or `mlp` (one round per hidden layer, then the output layer)',
        one_of(MODEL_KINDS), node=True, user=True,
        detail='The convex models (`logistic`, `random-features`, `kernel`) run the spaces '
        'round, then the selection round (`[ROUND 1/2]`, `[ROUND 2/2]`); `random-features` '
        'draws its map from the seed (`rf-map`, `rf-dim`), `kernel` takes its landmarks from '
        'class centres the nodes send in a landmark round (docs/kernel.md)')
    rf_map: str = setting(
        'fourier',
        _ROW_RF,
        one_of(MAPS), node=True, lab=True)  # nodes: DP's clip for Fourier features
    rf_dim: int = setting(
        2048,
        _ROW_RF,
        positive)
    kernel_landmarks: int = setting(
        4000,
        "`model='kernel'`: how many landmarks m the Nyström map takes: k-means centres of each "
        "class of each node's rows, each the mean of at least 5 rows (under `dp-epsilon`: the "
        "server's public rows); the model is the logistic model on the rows beside the m "
        "kernel features (docs/kernel.md)",
        positive)
    rf_bandwidth: str = setting(
        'auto',
        "`model='random-features'` and `model='kernel'`: the RBF width s (its inputs are divided by it, "
        "after `standardize`); `auto`: 0.6 times the RMS distance between two training rows, "
        "from the per-feature sums the nodes send in the identity round (measured on "
        "Fashion-MNIST's validation rows: results/benchmarks/random_features.json). Under "
        "`dp-epsilon` those sums would leave the nodes unnoised: give a number",
        parses(parse_rf_bandwidth), lab=True)
    hidden: str = setting(
        'auto',
        _ROW_HIDDEN,
        parses(check_hidden), node=True, user=True)
    dropout: float = setting(
        0.5,
        _ROW_HIDDEN,
        in_range(0.0, 1.0, "a fraction of units", closed="left"), node=True, user=True)
    local_solve: str = setting(
        'auto',
        "how a site fits a convex model (`logistic`, `random-features`, `kernel`): `auto` is "
        "`exact` for `logistic` and `adam` for the models on feature maps (measured: "
        "results/benchmarks/exact_solve.json, docs/method.md); `exact` "
        "solves its problem, mean cross-entropy plus 1e-3 / 2 times the squared weights, "
        "full batch from zero by L-BFGS preconditioned with its own Gram matrix (Böhning's "
        "bound) until no gradient entry exceeds 1e-4 (each reply reports the iterations and "
        "the final gradient); `adam`: the paper's Adam epochs (`local-lr`, `batch-size`, "
        "`local-max-epochs`, `local-patience`), as `profile='paper'` and the reproduction "
        "run them; a site whose rows do not fit in memory at once may choose it for itself "
        "(`--node-config \"local-solve='adam'\"`). The MLP always trains by epochs",
        one_of(LOCAL_SOLVES), node=True, lab=True)
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
    device: str = setting(
        'auto',
        'where local training, fine-tuning and feature extraction run: `auto` (CUDA when '
        'the process sees one, else CPU), `cpu`, or `cuda` (an error where there is no '
        'CUDA device); radius searches and the layer merge stay on the CPU',
        one_of(DEVICES), node=True, user=True)
    public_samples: int = setting(
        1000,
        "size of the server's public sample (0: no tuning, no Raw)",
        at_least(0, "0 turns fine-tuning and the Raw baseline off"), user=True)
    tune_epochs: int = setting(
        5,
        _ROW_TUNE_EPOCHS,
        at_least(0), lab=True)
    tune_lr: float = setting(
        0.001,
        _ROW_TUNE_EPOCHS,
        positive, lab=True)
    tune_stop: str = setting(
        'holdout',
        'how fine-tuning (GEMS tuned, Raw, the fine-tuning study) stops: `holdout` holds out '
        '20 % of the public sample, picks there the epoch (the start included; at most '
        '`tune-max-epochs`, ended by 5 epochs in which neither held-out accuracy nor loss '
        'improved) and, for a trained start, the factor it is shrunk by first (1, 0.5, 0.2 '
        'or 0), then tunes that long on the whole sample; '
        "`fixed` runs exactly `tune-epochs` epochs on all of it (the paper's recipe)",
        one_of(TUNE_STOPS), lab=True)
    tune_max_epochs: int = setting(
        50,
        '`tune-stop=holdout`: at most this many fine-tuning epochs',
        at_least(0), lab=True)
    tune_layers: str = setting(
        'auto',
        "MLP fine-tuning: the `last` layer only (the paper's choice), `all`, or `auto`: "
        'both, keeping the one that scores better on the held-out 20 % (with `tune-stop=fixed`, '
        'which holds nothing out: `last`)',
        one_of(TUNE_LAYERS), lab=True)
    tune_fresh: bool = setting(
        True,
        '`tune-stop=holdout`, GEMS tuned: also train a fresh model until convergence (Raw '
        "converged's recipe) on the same 80 % and keep it instead where it scores better "
        'on the held-out 20 % (`results.json` says which was kept: `fresh`); `false`: '
        'the tuned GEMS model always', lab=True)
    tune_curve: str = setting(
        '',
        'Fine-tuning study: comma-separated public sample sizes (e.g. `100,200,500`); the '
        'server then tunes GEMS, each Local model, Averaged and a fresh Raw model '
        'identically on nested samples of each size and writes the curve to `results.json` '
        '(`fine_tuning`). Empty: off',
        parses(parse_tune_curve), lab=True)
