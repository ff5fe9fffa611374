"""Run settings: one declaration per setting, one validated object built from them.

Every key of ``[tool.flwr.app.config]`` in ``pyproject.toml`` is one field of
:class:`Settings` (``-`` becomes ``_``), besides ``lab``: the text that sets the research
switches (fields declared ``lab=True``, :mod:`.lab`). Each field is declared with :func:`~gems_fl.settings.checks.setting`
in the module of its group (:mod:`.data`, :mod:`.training`, :mod:`.spaces`,
:mod:`.aggregation`, :mod:`.privacy`, :mod:`.operation`): its default (hence its type), its
meaning, its constraint, and whether nodes need it. From those declarations come the
validation (:meth:`Settings.from_run_config` stops a bad ``--run-config`` at the start with
a message naming the key; :mod:`.rules` checks the settings against each other), ``gems-fl
run --help``, the README's "Settings" table (:mod:`.doc`, checked by a test), and what a
node receives (:meth:`Settings.for_nodes`: only the settings node code reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from gems_fl.data.agreement import NODE_FILES, Scaling, resolve_standardize
from gems_fl.data.datasets import DATASETS
from gems_fl.geometry.choices import ClassGrams, KindTraits, kind_traits
from gems_fl.geometry.points import CLASS_GRAMS, point_named
from gems_fl.learning.model_kinds import ModelKind, model_kind
from gems_fl.learning.recipe import LocalTraining, TrainRecipe, TuneRecipe
from gems_fl.learning.widths import parse_hidden
from gems_fl.settings.aggregation import AggregationSettings
from gems_fl.settings.checks import SettingsError, coerce, key_of
from gems_fl.settings.data import DataSettings
from gems_fl.settings.lab import LAB_KEY, expand_lab
from gems_fl.settings.operation import PAPER_PROFILE, OperationSettings
from gems_fl.settings.privacy import PrivacySettings
from gems_fl.settings.rules import check_rules
from gems_fl.settings.spaces import SpaceSettings
from gems_fl.settings.training import TrainingSettings
from gems_fl.settings.values import parse_pooled_ridge, parse_refine_l2, parse_tune_curve, run_gram_rank

if TYPE_CHECKING:
    from torch import nn

__all__ = ["GROUPS", "LAB_KEY", "AggregationSettings", "DataSettings", "OperationSettings",
           "PrivacySettings", "Settings", "SettingsError", "SpaceSettings", "TrainingSettings",
           "lab_keys", "node_keys", "product_keys"]

#: the settings' groups, each a frozen config of its own (:meth:`Settings.part`)
GROUPS = (DataSettings, TrainingSettings, SpaceSettings, AggregationSettings, PrivacySettings,
          OperationSettings)
Group = TypeVar("Group", DataSettings, TrainingSettings, SpaceSettings, AggregationSettings,
                PrivacySettings, OperationSettings)

#: Paths only a partitioned dataset's nodes read (the files a simulation cuts into
#: partitions); nodes on their own files (``node-files``) never receive them.
PARTITION_PATHS = ("data-dir", "feature-cache-dir", "vgg16-weights")

# What `hidden = "auto"` means on the sites' own files (a registered dataset says its own:
# the paper's 100 for CIFAR-10, 50 otherwise).
AUTO_HIDDEN_DEFAULT = "50"
# the run settings a node's own --node-config may override
NODE_OVERRIDES = ("eps", "local-max-epochs", "local-patience", "local-solve")


@dataclass(frozen=True)
class Settings(OperationSettings, PrivacySettings, AggregationSettings, SpaceSettings,
               TrainingSettings, DataSettings):
    """Validated run settings (see README.md, "Settings"): the groups' fields, data
    first (the README table's order).

    ``scope="node"`` builds what a node holds: the settings it received
    (:meth:`for_nodes`), validated; the server-only ones are ``None`` there, so node
    code that reads one fails loudly instead of using a default the operator never set.
    """

    def __init__(self, scope: str = "run", **given: Any) -> None:
        # each field is set once, to its resolved value: nothing is rewritten afterwards
        unknown = sorted(set(given) - set(_DEFAULTS))
        if unknown:
            raise TypeError(f"Settings() got unexpected keyword argument(s): {', '.join(unknown)}")
        node_only = scope == "node"
        for name, value in _resolved({**_DEFAULTS, **given}, node_only).items():
            object.__setattr__(self, name, value)
        check_rules(self, node_only)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Build settings from a Flower run config (keys as in ``pyproject.toml``).

        Unknown keys are ignored (Flower passes the whole app config); each known key
        must have the type of its default. The ``lab`` text is read into the research
        switches it names (:func:`~gems_fl.settings.lab.expand_lab`).
        """
        return cls(**_known(expand_lab(run_config, _LAB_DEFAULTS, product_keys())))

    @classmethod
    def from_node_config(cls, config: Mapping[str, Any]) -> Settings:
        """What a node holds: the settings of a message (:meth:`for_nodes`), validated."""
        return cls(**_known(config, node_only=True), scope="node")

    def for_node(self, node_config: Mapping[str, Any]) -> Settings:
        """These settings with the node's own overrides (keys in ``NODE_OVERRIDES``).

        A node may choose its own target accuracy: ``--node-config "eps=0.6"`` (the
        paper's intersection analysis gives each node a different eps), its own
        training budget (``local-max-epochs``, ``local-patience``: a site with little
        compute caps its training), and how it fits a convex model (``local-solve``: a
        site whose rows do not fit in memory at once trains by mini-batch epochs).
        """
        kwargs = {key.replace("-", "_"): coerce(key, node_config[key], getattr(self, key.replace("-", "_")))
                  for key in NODE_OVERRIDES if key in node_config}
        if not kwargs:
            return self
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["node"]}
        return type(self)(**{**values, **kwargs}, scope="node")

    def part(self, group: type[Group]) -> Group:
        """One group of these settings as its own frozen config (say
        ``settings.part(DataSettings)``), its values as resolved here: what a component
        that reads only that group takes instead of the whole settings."""
        if not (isinstance(group, type) and issubclass(Settings, group) and group is not Settings):
            raise TypeError(f"{group!r} is not one of the settings' groups "
                            f"({', '.join(g.__name__ for g in GROUPS)})")
        return group(**{f.name: getattr(self, f.name) for f in fields(group)})

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
                          stop=self.tune_stop, max_epochs=self.tune_max_epochs,
                          fresh=self.local_recipe if self.tune_fresh else None)

    @property
    def local_training(self) -> LocalTraining:
        """How local models are built and trained (``model``, ``hidden``, ``dropout``, recipe)."""
        return LocalTraining(self.model, tuple(self.hidden_widths), self.dropout,
                             self.local_recipe, solve=self.local_solve)

    def new_model(self, num_features: int, num_classes: int) -> nn.Module:
        """A fresh model of the configured kind (``model``, ``hidden``, ``dropout``)."""
        return self.local_training.new_model(num_features, num_classes)

    def to_config(self) -> dict[str, Any]:
        """Settings as a flat ``{key: value}`` dict with ``pyproject.toml`` keys."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}

    @property
    def model_kind(self) -> ModelKind:
        """The registered model the run trains (:mod:`gems_fl.learning.model_kinds`)."""
        return model_kind(self.model)

    @property
    def space_kind(self) -> KindTraits:
        """What the run's space kind is (:class:`~gems_fl.geometry.choices.KindTraits`):
        code asks ``settings.space_kind.statistics``, never compares the name."""
        return kind_traits(self.space)

    @property
    def identity_sums(self) -> bool:
        """Whether the identity round asks the nodes for per-feature sums: for the
        federated scaling, and for the random-feature map's bandwidth (``rf-bandwidth``
        ``auto``; never under ``dp-epsilon``, where they would leave the nodes unnoised)."""
        return self.standardize == Scaling.FEDERATED or (
            self.model_kind.feature_map is not None and not self.dp_epsilon)

    def for_nodes(self) -> dict[str, Any]:
        """The settings node code reads, as ``{key: value}``: what every message carries.
        With ``dataset='node-files'`` each node reads its own file, so the server's data
        paths (:data:`PARTITION_PATHS`) stay on the server."""
        out = {key_of(f): getattr(self, f.name) for f in fields(self) if f.metadata["node"]}
        if CLASS_GRAMS in point_named(self.gram_point).needs and self.class_grams == ClassGrams.AUTO:
            out["class-grams"] = "true"  # the point needs them whatever the layer's size
        if self.dataset == NODE_FILES:
            for key in PARTITION_PATHS:
                out.pop(key, None)
        return out


_DEFAULTS = {f.name: f.default for f in fields(Settings)}


def _resolved(values: dict[str, Any], node_only: bool) -> dict[str, Any]:
    """The fields' values as the settings hold them: the paper profile's values where a
    field was left at its default, every ``auto`` the settings resolve themselves, each
    value checked; for a node (``node_only``), the server-side fields ``None``."""
    values = dict(values)
    if values["profile"] == "paper":
        for key, value in PAPER_PROFILE.items():
            name = key.replace("-", "_")
            if values[name] == _DEFAULTS[name]:
                values[name] = value
    values["standardize"] = resolve_standardize(
        values["standardize"], values["dataset"], bool(values["dp_epsilon"]),
        bool(values["feature_ranges"].strip()))
    if values["hidden"].strip().lower() == "auto":
        dataset = values["dataset"]
        values["hidden"] = DATASETS[dataset].hidden if dataset in DATASETS else AUTO_HIDDEN_DEFAULT
    # "auto", or the rank as an int whether it came as 50 or "50" (--run-config)
    whole = (values["secure_aggregation"] or values["dp_epsilon"]
             or model_kind(values["model"]).layerwise)
    values["gram_rank"] = run_gram_rank(values["gram_rank"], whole)
    values["refine_l2"] = parse_refine_l2(values["refine_l2"])
    for f in fields(Settings):
        value = values[f.name]
        if node_only and not f.metadata["node"]:
            if value != f.default:
                raise SettingsError(f"{key_of(f)} is a server-side setting; nodes do not "
                                    "receive it")
            values[f.name] = None
            continue
        if f.metadata["check"] is not None:
            f.metadata["check"](key_of(f), value)
    return values
_LAB_DEFAULTS = {key_of(f): f.default for f in fields(Settings) if f.metadata["lab"]}


def node_keys() -> tuple[str, ...]:
    """The keys of the settings nodes receive."""
    return tuple(key_of(f) for f in fields(Settings) if f.metadata["node"])


def lab_keys() -> tuple[str, ...]:
    """The research switches (declared ``lab=True``): set inside the ``lab`` setting."""
    return tuple(key_of(f) for f in fields(Settings) if f.metadata["lab"])


def product_keys() -> tuple[str, ...]:
    """The product's settings: the keys of the app's ``[tool.flwr.app.config]`` besides
    ``lab``."""
    return tuple(key_of(f) for f in fields(Settings) if not f.metadata["lab"])


def _known(config: Mapping[str, Any], node_only: bool = False) -> dict[str, Any]:
    return {f.name: coerce(key_of(f), config[key_of(f)], f.default) for f in fields(Settings)
            if key_of(f) in config and (f.metadata["node"] or not node_only)}
