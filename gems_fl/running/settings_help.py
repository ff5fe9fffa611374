"""What each run setting means: the one source of `gems-fl run --help` and README's table.

Each entry is one row of README.md's "Settings" table: the keys it documents and its
meaning column, word for word (``tests/test_run_behaviour.py`` checks that they agree).
Defaults are not repeated here; they come from ``[tool.flwr.app.config]``.
"""

from __future__ import annotations

SETTINGS_HELP: dict[tuple[str, ...], str] = {
    ('dataset',): (
        '`digits` (scikit-learn, bundled), `fashion-mnist` (IDX files), `mnist` (IDX files), `cifar10` (python batches, VGG-16 features), `ham10000` (metadata CSV + JPEGs, CNN features), or `node-files` (each SuperNode\'s own file, any features and classes, agreed in the identity round); see "CIFAR-10", "HAM10000" and "Your own data" below'
    ),
    ('data-dir',): (
        'folder of the IDX files; empty: `/usr/share/datasets/fashion-mnist` for Fashion-MNIST (Debian package `dataset-fashion-mnist`); required for MNIST (torchvision downloads it there when online), CIFAR-10 and HAM10000'
    ),
    ('label-division',): (
        '`paper` (the appendix table, K = 2, 3, 5), `classes-per-node:N`, `iid`, or explicit groups such as `0,1/2,3/4,5/6,7/8,9`'
    ),
    ('model',): (
        '`logistic` (convex, one round) or `mlp` (layer-wise protocol, one round per hidden layer plus one)'
    ),
    ('hidden', 'dropout'): (
        'MLP hidden widths (`"100,50"` for two layers) and dropout after each hidden layer; `auto` is the paper\'s width for the dataset: `100` for `cifar10`, `50` for every other'
    ),
    ('eps-neuron',): (
        "eps_j: a perturbed neuron is good enough while its outputs on the node's validation inputs deviate by at most this"
    ),
    ('neuron-criterion',): (
        "deviation of a neuron's outputs: `rms` (root mean square) or `paper` (L2 norm divided by N, the paper's eq. 3)"
    ),
    ('neuron-delta',): (
        'bisection width of the per-neuron radius search'
    ),
    ('clusters',): (
        'm_eps, k-means clusters over all neurons of all nodes'
    ),
    ('tune-layers',): (
        "MLP fine-tuning: `last` layer only (the paper's choice) or `all`"
    ),
    ('tune-curve',): (
        'Fine-tuning study: comma-separated public sample sizes (e.g. `100,200,500`); the server then tunes GEMS, each Local model, Averaged and a fresh Raw model identically on nested samples of each size and writes the curve to `results.json` (`fine_tuning`). Empty: off'
    ),
    ('space',): (
        '`gram` (logit-space ellipsoid, see "Good-enough spaces"; the default), or the paper\'s `ball` or `ellipsoid` (Fisher axes, appendix A)'
    ),
    ('gram-rank',): (
        "`gram` only: 0 sends the node's full Gram matrix (upper triangle, float32); r > 0 sends a rank-r factor instead (fewer bytes, a coarser space)"
    ),
    ('gram-ridge',): (
        '`gram` only: ridge added to the weighted sum of Gram matrices in the closed-form center (relative to one mean Gram matrix)'
    ),
    ('gram-weighting',): (
        "`gram` only: lambda_k in the center, `samples` (the node's training-sample count) or `radius` (1 / rho_k^2)"
    ),
    ('gram-point',): (
        '`gram` only: `closed-form` always uses the weighted center; `shared` uses the point minimising the largest scaled distance when the center misses a space and that point lies in all of them'
    ),
    ('ellipsoid-floor',): (
        "ellipsoid axes `max(F_ref / F_i, c)`: `quantile` takes F_ref as the 5 % quantile of the nonzero Fisher entries; `paper` is appendix A's min over all entries, which collapses every axis to c when some entry is 0"
    ),
    ('eps',): (
        'Q: a model is good enough on a node when its validation accuracy is >= eps. A node may set its own with `--node-config "eps=0.6"`'
    ),
    ('num-directions',): (
        'p, surface samples per tested radius'
    ),
    ('r-max',): (
        'upper end of the radius bisection'
    ),
    ('delta',): (
        'bisection stops at this width'
    ),
    ('ellipsoid-c',): (
        'c of appendix A: shortest axis relative to the longest'
    ),
    ('seed',): (
        'seeds splits, partitions, initialisation, directions, public sample'
    ),
    ('local-lr', 'batch-size'): (
        'Adam learning rate and batch size for all training'
    ),
    ('local-max-epochs', 'local-patience'): (
        'training stops when for `local-patience` epochs neither the training accuracy reached a new best nor the loss fell by 1e-3; at most `local-max-epochs`'
    ),
    ('public-samples',): (
        "size of the server's public sample (0: no tuning, no Raw)"
    ),
    ('tune-epochs', 'tune-lr'): (
        'fine-tuning recipe, also used for Raw'
    ),
    ('min-replies',): (
        'fewer valid replies than this stops the run with an error'
    ),
    ('no-intersection',): (
        "fallback when the spaces do not intersect: `min-penalty` (minimise the paper's objective) or `mean`"
    ),
    ('evaluate-on-server',): (
        'the server loads the dataset for Global, Raw and the test set; set `false` where it holds no data'
    ),
    ('output-dir',): (
        'results go to `<output-dir>/run-<run id>/`'
    ),
    ('vgg16-weights',): (
        "CIFAR-10: a local VGG-16 state dict (torchvision's `vgg16-397923af.pth`); empty: torchvision fetches `VGG16_Weights.IMAGENET1K_V1` (needs torchvision and internet)"
    ),
    ('feature-cache-dir',): (
        "where extracted CIFAR-10 / HAM10000 features (and HAM10000's decoded images) are cached; empty: `~/.cache/gems-fl/features` (`$XDG_CACHE_HOME/gems-fl/features` when set)"
    ),
    ('ham10000-per-class', 'ham10000-cnn-epochs'): (
        "HAM10000: images per class after balancing (the paper's 2000) and training epochs of the feature CNN"
    ),
    ('round-timeout',): (
        "seconds the server waits for the replies of one round; also each message's TTL, so work for a slow or dead node is dropped, not left queued"
    ),
    ('allow-overlap',): (
        'an explicit `label-division` may give a class to several nodes (its samples are split among them); otherwise that is refused before the run starts, as a likely typo'
    ),
    ('device',): (
        'where local training, fine-tuning and feature extraction run: `auto` (CUDA when the process sees one, else CPU), `cpu`, or `cuda` (an error where there is no CUDA device); radius searches and the layer merge stay on the CPU'
    ),
    ('max-width',): (
        'MLP: the most neurons a merged hidden layer may have (0: no bound). Above it, the neurons that merged with no other are replaced by k-means centers of them, reported as unverified'
    ),
    ('num-features',): (
        "`dataset='node-files'`: the number of features every node's file must have; 0: the count most nodes report in the identity round (nodes with another count are left out and named)"
    ),
    ('classes',): (
        "`dataset='node-files'`: the class labels, as comma-separated names (`'benign,malignant'`, in index order) or a count (`3`: labels `0..2`, or the 3 names most nodes hold); empty: every label the nodes hold, sorted (numerically when all are integers)"
    ),
    ('label-column',): (
        "CSV files (nodes and `public-data`): the label's column, as a 0-based number (negative counts from the end) or a header name; empty: the last column"
    ),
    ('standardize',): (
        "feature scaling before training and evaluation: `off`, `node` (each node its own training mean and std), or `federated` (one mean and std for all, combined on the server from each node's per-feature count, sum and sum of squares sent in the identity round; no rows leave a node)"
    ),
    ('public-data',): (
        'a file on the server (`.npz` with `x`, `y` and optionally `x_test`, `y_test`; or `.csv`, with `<stem>_test.csv` optional) to fine-tune GEMS and train Raw on; without a server test set the nodes evaluate those models too. Empty: off'
    ),
}


def meaning(key: str) -> str:
    """The README meaning of one setting (``KeyError`` if undocumented)."""
    for keys, text in SETTINGS_HELP.items():
        if key in keys:
            return text
    raise KeyError(key)
