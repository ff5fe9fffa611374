"""Run settings: one validated object built from ``[tool.flwr.app.config]``.

Every key of ``[tool.flwr.app.config]`` in ``pyproject.toml`` maps to one field here
(``-`` becomes ``_``). :meth:`Settings.from_run_config` checks each value at the
boundary so that a bad ``--run-config`` stops the run at start with a message naming
the key, instead of failing minutes later inside a client.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Mapping

from gems_fl.data.agreement import NODE_FILES, STANDARDIZE_CHOICES
from gems_fl.data.datasets import DATASET_NAMES
from gems_fl.geometry.choices import (
    ELLIPSOID_FLOORS,
    GRAM_POINTS,
    GRAM_WEIGHTINGS,
    NO_INTERSECTION_FALLBACKS,
    SPACE_KINDS,
)
from gems_fl.learning.recipe import TrainRecipe, TuneRecipe
from gems_fl.learning.widths import parse_hidden

if TYPE_CHECKING:
    from torch import nn

# What `hidden = "auto"` means per dataset (the paper: 100 for CIFAR-10, 50 otherwise).
AUTO_HIDDEN = {"cifar10": "100"}
AUTO_HIDDEN_DEFAULT = "50"
MODELS = ("logistic", "mlp")
NEURON_CRITERIA = ("rms", "paper")
TUNE_LAYERS = ("last", "all")
DEVICES = ("auto", "cpu", "cuda")  # resolved per process: gems_fl.learning.train.resolve_device
NODE_OVERRIDES = ("eps",)  # run settings a node's own --node-config may override


class SettingsError(ValueError):
    """A run setting has an invalid value; the message names the key."""


@dataclass(frozen=True)
class Settings:
    """Validated run settings (see README.md, "Settings")."""

    dataset: str = "digits"
    data_dir: str = ""
    label_division: str = "paper"
    model: str = "logistic"
    hidden: str = "auto"
    dropout: float = 0.5
    space: str = "gram"
    eps: float = 0.4
    num_directions: int = 500
    r_max: float = 4000.0
    delta: float = 0.01
    ellipsoid_c: float = 0.1
    eps_neuron: float = 0.1
    neuron_criterion: str = "rms"
    neuron_delta: float = 0.01
    clusters: int = 75
    seed: int = 0
    local_lr: float = 0.001
    batch_size: int = 32
    local_max_epochs: int = 100
    local_patience: int = 3
    public_samples: int = 1000
    tune_epochs: int = 5
    tune_lr: float = 0.001
    tune_layers: str = "last"
    tune_curve: str = ""
    min_replies: int = 2
    no_intersection: str = "min-penalty"
    evaluate_on_server: bool = True
    output_dir: str = "gems-results"
    vgg16_weights: str = ""
    feature_cache_dir: str = ""
    ham10000_per_class: int = 2000
    ham10000_cnn_epochs: int = 10
    round_timeout: float = 1800.0
    gram_rank: int = 0
    gram_ridge: float = 1e-6
    gram_weighting: str = "samples"
    gram_point: str = "closed-form"
    ellipsoid_floor: str = "quantile"
    allow_overlap: bool = False
    device: str = "auto"
    max_width: int = 0
    num_features: int = 0
    classes: str = ""
    label_column: str = ""
    standardize: str = "off"
    public_data: str = ""

    def __post_init__(self) -> None:
        _choice("dataset", self.dataset, (*DATASET_NAMES, NODE_FILES))
        if self.hidden.strip().lower() == "auto":
            object.__setattr__(self, "hidden", AUTO_HIDDEN.get(self.dataset, AUTO_HIDDEN_DEFAULT))
        if self.ham10000_per_class < 4:
            raise SettingsError(
                f"ham10000-per-class={self.ham10000_per_class} must be >= 4: every class needs "
                "an image in each of train, public, val and test"
            )
        _positive("ham10000-cnn-epochs", self.ham10000_cnn_epochs)
        _choice("model", self.model, MODELS)
        _choice("space", self.space, SPACE_KINDS)
        _choice("no-intersection", self.no_intersection, NO_INTERSECTION_FALLBACKS)
        _choice("neuron-criterion", self.neuron_criterion, NEURON_CRITERIA)
        _choice("tune-layers", self.tune_layers, TUNE_LAYERS)
        try:
            parse_hidden(self.hidden)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if not 0.0 <= self.dropout < 1.0:
            raise SettingsError(f"dropout={self.dropout} must be in [0, 1)")
        _positive("eps-neuron", self.eps_neuron)
        _positive("neuron-delta", self.neuron_delta)
        _positive("clusters", self.clusters)
        _in_range("eps", self.eps, 0.0, 1.0, "a target accuracy between 0 and 1")
        _positive("num-directions", self.num_directions)
        _positive("r-max", self.r_max)
        _positive("delta", self.delta)
        if self.delta >= self.r_max:
            raise SettingsError(
                f"delta={self.delta} must be smaller than r-max={self.r_max}: delta is "
                "the width at which the radius bisection over [0, r-max] stops"
            )
        if not 0.0 < self.ellipsoid_c <= 1.0:
            raise SettingsError(
                f"ellipsoid-c={self.ellipsoid_c} must be in (0, 1]: it is the shortest "
                "ellipsoid axis relative to the longest (appendix A's c)"
            )
        if self.seed < 0:
            raise SettingsError(f"seed={self.seed} must be >= 0")
        _positive("local-lr", self.local_lr)
        _positive("batch-size", self.batch_size)
        _positive("local-max-epochs", self.local_max_epochs)
        _positive("local-patience", self.local_patience)
        if self.public_samples < 0:
            raise SettingsError(
                f"public-samples={self.public_samples} must be >= 0 (0 turns fine-tuning "
                "and the Raw baseline off)"
            )
        if self.tune_epochs < 0:
            raise SettingsError(f"tune-epochs={self.tune_epochs} must be >= 0")
        _positive("tune-lr", self.tune_lr)
        self.tune_sizes  # noqa: B018 - validates tune-curve
        _positive("min-replies", self.min_replies)
        _positive("round-timeout", self.round_timeout)
        if self.gram_rank < 0:
            raise SettingsError(f"gram-rank={self.gram_rank} must be >= 0 (0 sends the full "
                                "Gram matrix, r > 0 a rank-r factor)")
        if self.gram_ridge < 0:
            raise SettingsError(f"gram-ridge={self.gram_ridge} must be >= 0")
        _choice("gram-weighting", self.gram_weighting, GRAM_WEIGHTINGS)
        _choice("gram-point", self.gram_point, GRAM_POINTS)
        _choice("ellipsoid-floor", self.ellipsoid_floor, ELLIPSOID_FLOORS)
        self._check_node_files()
        if not self.output_dir:
            raise SettingsError("output-dir must name a folder, e.g. 'gems-results'")
        _choice("device", self.device, DEVICES)
        if self.max_width < 0:
            raise SettingsError(f"max-width={self.max_width} must be >= 0 (0: no bound on the "
                                "merged width of a hidden layer)")

    def _check_node_files(self) -> None:
        """``num-features``, ``classes``, ``standardize``, ``public-data`` and node-files."""
        from gems_fl.data.site_files import parse_classes

        _choice("standardize", self.standardize, STANDARDIZE_CHOICES)
        if self.num_features < 0:
            raise SettingsError(f"num-features={self.num_features} must be >= 0 (0: agreed "
                                "from what the nodes report)")
        try:
            classes = parse_classes(self.classes)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if isinstance(classes, int) and classes < 2:
            raise SettingsError(f"classes={self.classes!r}: a classifier needs at least 2 classes")
        if isinstance(classes, list) and len(classes) < 2:
            raise SettingsError(f"classes={self.classes!r}: a classifier needs at least 2 classes")
        if self.dataset == NODE_FILES:
            if self.evaluate_on_server and not self.public_data.strip():
                raise SettingsError(
                    "dataset='node-files' keeps the data on the nodes, so the server has nothing "
                    "to evaluate on: set evaluate-on-server=false (the nodes evaluate every "
                    "model on their own data), or give public-data with a test split")
            if self.evaluate_on_server and self.model == "mlp":
                raise SettingsError(
                    "dataset='node-files' with model='mlp': set evaluate-on-server=false (the "
                    "server cannot rebuild the nodes' local MLPs without their data)")
            return
        from gems_fl.data.datasets import DATASET_SHAPES

        features, count = DATASET_SHAPES[self.dataset]
        if self.num_features not in (0, features):
            raise SettingsError(f"num-features={self.num_features} but dataset='{self.dataset}' "
                                f"has {features}; num-features pins dataset='node-files' runs")
        if classes is not None and (classes if isinstance(classes, int) else len(classes)) != count:
            raise SettingsError(f"classes={self.classes!r} but dataset='{self.dataset}' has "
                                f"{count} classes; classes pins dataset='node-files' runs")

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "Settings":
        """Build settings from a Flower run config (keys as in ``pyproject.toml``).

        Unknown keys are ignored (Flower passes the whole app config); each known key
        must have the type of its default.
        """
        kwargs: dict[str, Any] = {}
        for field in fields(cls):
            key = field.name.replace("_", "-")
            if key not in run_config:
                continue
            kwargs[field.name] = _coerce(key, run_config[key], field.default)
        return cls(**kwargs)

    def for_node(self, node_config: Mapping[str, Any]) -> "Settings":
        """These settings with the node's own overrides (keys in ``NODE_OVERRIDES``).

        A node may choose its own target accuracy: ``--node-config "eps=0.6"`` (the
        paper's intersection analysis gives each node a different eps).
        """
        kwargs = {key.replace("-", "_"): _coerce(key, node_config[key], getattr(self, key.replace("-", "_")))
                  for key in NODE_OVERRIDES if key in node_config}
        return replace(self, **kwargs) if kwargs else self

    @property
    def hidden_widths(self) -> list[int]:
        """Configured hidden widths of the MLP (``hidden`` parsed)."""
        return parse_hidden(self.hidden)

    @property
    def tune_sizes(self) -> list[int]:
        """Public sample sizes of the fine-tuning study (``tune-curve`` parsed)."""
        text = self.tune_curve.strip()
        if not text:
            return []
        try:
            sizes = [int(part) for part in text.split(",")]
        except ValueError:
            raise SettingsError(
                f"tune-curve={self.tune_curve!r} must be comma-separated sample sizes, "
                "e.g. '100,200,500', or empty to skip the fine-tuning study"
            ) from None
        if any(n <= 0 for n in sizes):
            raise SettingsError(f"tune-curve={self.tune_curve!r}: every size must be > 0")
        return sizes

    @property
    def local_recipe(self) -> TrainRecipe:
        """How every model trained to convergence is trained (local, Global, Raw converged)."""
        return TrainRecipe(lr=self.local_lr, batch_size=self.batch_size,
                           max_epochs=self.local_max_epochs, patience=self.local_patience)

    @property
    def tune_recipe(self) -> TuneRecipe:
        """How GEMS tuned, Raw and every model of the fine-tuning study are tuned."""
        return TuneRecipe(epochs=self.tune_epochs, lr=self.tune_lr, batch_size=self.batch_size)

    def new_model(self, num_features: int, num_classes: int) -> "nn.Module":
        """A fresh model of the configured kind (``model``, ``hidden``, ``dropout``)."""
        from gems_fl.learning.models import build_model

        return build_model(self.model, num_features, num_classes, self.hidden_widths,
                           self.dropout)

    def to_config(self) -> dict[str, Any]:
        """Settings as a flat ``{key: value}`` dict with ``pyproject.toml`` keys."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}


def _coerce(key: str, value: Any, default: Any) -> Any:
    expected = type(default)
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    raise SettingsError(
        f"{key}={value!r} has type {type(value).__name__}, expected "
        f"{expected.__name__} (like the default {default!r})"
    )


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SettingsError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise SettingsError(f"{key}={value!r} must be > 0")


def _in_range(key: str, value: float, low: float, high: float, meaning: str) -> None:
    if not low <= value <= high:
        raise SettingsError(f"{key}={value!r} must be in [{low}, {high}]: {meaning}")
