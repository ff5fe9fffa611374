"""Training recipes: the few numbers that say how a model is trained, in one object.

``Settings`` builds one recipe per purpose (:attr:`Settings.local_recipe` for every
model trained until convergence, :attr:`Settings.tune_recipe` for fine-tuning and Raw)
and the code passes the recipe down instead of unpacking lr, batch, epochs and patience
at every call site.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported when a recipe is used, not when settings are read
    import numpy as np
    from torch import nn

    from gems_fl.learning.train import TrainReport


@dataclass(frozen=True)
class TrainRecipe:
    """Adam until the training accuracy converges (see ``train_until_converged``)."""

    lr: float
    batch_size: int
    max_epochs: int
    patience: int

    def train(self, model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int) -> TrainReport:
        """Train ``model`` in place on ``(x, y)``."""
        from gems_fl.learning.train import train_until_converged

        return train_until_converged(model, x, y, lr=self.lr, batch_size=self.batch_size,
                                     max_epochs=self.max_epochs, patience=self.patience,
                                     seed=seed)


class TuneStop(StrEnum):
    """``tune-stop``: hold out part of the public sample and keep the best epoch, or a fixed number of epochs."""

    HOLDOUT = "holdout"
    FIXED = "fixed"


TUNE_STOPS = tuple(m.value for m in TuneStop)
#: which layers of a trained MLP fine-tuning updates: the output layer (the paper), all of
#: them, or whichever of the two scores better on the held-out rows (``tune-stop=holdout``)
class TuneLayers(StrEnum):
    """``tune-layers``: which layers the public sample tunes."""

    AUTO = "auto"
    LAST = "last"
    ALL = "all"


TUNE_LAYERS = tuple(m.value for m in TuneLayers)
WARM_SHRINKS = (1.0, 0.5, 0.2, 0.0)  # factors a warm start is tried at (tune-stop=holdout)


@dataclass(frozen=True)
class TuneRecipe:
    """Adam on a public sample: ``stop='holdout'`` holds out ``holdout_fraction`` of it and
    keeps the best epoch there (at most ``max_epochs``, stopping after ``patience`` epochs
    without a new best; see ``fine_tune_holdout``); ``stop='fixed'`` runs exactly
    ``epochs`` epochs on all of it (the paper's recipe; see ``fine_tune``)."""

    epochs: int
    lr: float
    batch_size: int
    stop: str = "fixed"
    max_epochs: int = 50
    patience: int = 5
    holdout_fraction: float = 0.2
    #: ``stop='holdout'``: the recipe of a fresh model trained until convergence, which
    #: :meth:`tune_or_fresh` scores on the same held-out rows as the tuned start (None: not tried)
    fresh: TrainRecipe | None = None

    def __post_init__(self) -> None:
        if self.stop not in TUNE_STOPS:
            raise ValueError(f"stop={self.stop!r} is not one of {', '.join(TUNE_STOPS)}")

    @property
    def active(self) -> bool:
        """Whether this recipe tunes at all (``fixed`` with 0 epochs does not)."""
        return self.max_epochs > 0 if self.stop == TuneStop.HOLDOUT else self.epochs > 0

    def describe(self) -> str:
        """The recipe in a few words, for logs."""
        if self.stop == TuneStop.HOLDOUT:
            return (f"up to {self.max_epochs} epochs, the epoch (and a trained start's "
                    f"shrink factor) chosen on a held-out {self.holdout_fraction:.0%} of the "
                    "sample, then tuned on all of it"
                    + (" (a fresh model trained to convergence is kept instead where it "
                       "scores better there)" if self.fresh is not None else ""))
        return f"{self.epochs} epochs"

    def tune(self, model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int,
             warm: bool = False) -> TrainReport:
        """Fine-tune the trainable weights of ``model`` in place on ``(x, y)``.

        ``warm``: ``model`` is a trained start (GEMS, a local model), not a fresh one.
        Held out, the start is then also tried shrunk towards zero by each factor of
        :data:`WARM_SHRINKS` and the held-out rows pick one ("shrink and perturb", Ash &
        Adams 2020: a warm start with large weights can tune to a worse model than a cold
        one, e.g. a GEMS model whose nodes never saw some classes).
        """
        from gems_fl.learning.train import fine_tune, fine_tune_holdout

        if self.stop == TuneStop.HOLDOUT:
            return fine_tune_holdout(model, x, y, max_epochs=self.max_epochs,
                                     patience=self.patience,
                                     holdout_fraction=self.holdout_fraction, lr=self.lr,
                                     batch_size=self.batch_size, seed=seed,
                                     shrinks=WARM_SHRINKS if warm else (1.0,))
        return fine_tune(model, x, y, epochs=self.epochs, lr=self.lr,
                         batch_size=self.batch_size, seed=seed)

    def tune_trained(self, model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int,
                     layers: str) -> TrainReport:
        """Fine-tune a trained start (GEMS, a local model) in place, as :meth:`tune` with
        ``warm=True``, updating the ``layers`` of :data:`TUNE_LAYERS`.

        ``last`` freezes the hidden layers (linear probing on their features); ``all``
        tunes every layer; ``auto`` tunes a copy each way and keeps the one whose held-out
        score (accuracy, then loss) is higher, ``last`` on a tie (with ``stop='fixed'``,
        which holds nothing out, ``auto`` is ``last``). A model without hidden layers is
        tuned once. The report's ``layers`` says which were tuned.
        """
        import copy

        from gems_fl.learning.models import freeze_hidden

        if layers not in TUNE_LAYERS:
            raise ValueError(f"layers={layers!r} is not one of {', '.join(TUNE_LAYERS)}")
        if not list(getattr(model, "hidden", [])):
            report = self.tune(model, x, y, seed, warm=True)
            report.layers = "all"
            return report
        if layers == TuneLayers.AUTO and self.stop != TuneStop.HOLDOUT:
            layers = "last"  # nothing held out to choose on: the paper's choice
        if layers != TuneLayers.AUTO:
            if layers == TuneLayers.LAST:
                freeze_hidden(model)
            report = self.tune(model, x, y, seed, warm=True)
            report.layers = layers
            return report
        best: tuple[TrainReport, nn.Module] | None = None
        for choice in ("last", "all"):
            candidate = copy.deepcopy(model)
            if choice == "last":
                freeze_hidden(candidate)
            report = self.tune(candidate, x, y, seed, warm=True)
            report.layers = choice
            if best is None or _score(report) > _score(best[0]):
                best = (report, candidate)
        report, chosen = best
        if report.layers == TuneLayers.LAST:
            freeze_hidden(model)
        model.load_state_dict(chosen.state_dict())
        return report

    def tune_or_fresh(self, model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int,
                      layers: str, fresh_model: Callable[[], nn.Module]
                      ) -> tuple[nn.Module, TrainReport]:
        """The better of ``model`` tuned (:meth:`tune_trained`, in place) and a fresh model
        trained until convergence (:attr:`fresh`), as ``(model, report)``.

        Both are scored on the same held-out rows; the tuned start is kept on a tie. The
        fresh one, built by ``fresh_model`` (it may have other hidden widths than
        ``model``), is first trained on the other rows only, for that score, and where it
        wins, a second one is trained on every row: the model Raw converged trains when
        ``fresh_model`` builds Raw's start. Why: a start far from every class (a GEMS
        model whose nodes each saw a few) can tune, within the epochs the held-out rows
        allow, to a model below what the public sample alone gives; the held-out rows
        see that and keep the better. Without a held-out rule or :attr:`fresh`, this is
        :meth:`tune_trained`. The report's ``fresh`` says which was kept, its
        ``holdout_score`` and ``rival_score`` the held-out scores of the kept one and the other.
        """
        report = self.tune_trained(model, x, y, seed, layers)
        if self.stop != TuneStop.HOLDOUT or self.fresh is None or report.holdout_score is None:
            return model, report
        from gems_fl.learning.train import converged_holdout_score

        recipe = self.fresh
        score = converged_holdout_score(
            fresh_model(), x, y, holdout_fraction=self.holdout_fraction, lr=recipe.lr,
            batch_size=recipe.batch_size, max_epochs=recipe.max_epochs,
            patience=recipe.patience, seed=seed)
        if score <= report.holdout_score:
            report.rival_score = score
            return model, report
        chosen = fresh_model()
        fresh_report = recipe.train(chosen, x, y, seed)
        fresh_report.holdout_score, fresh_report.fresh = score, True
        fresh_report.rival_score = report.holdout_score
        fresh_report.layers = "all"
        return chosen, fresh_report


def _score(report: TrainReport) -> tuple[float, float]:
    """A tuning's held-out (accuracy, -loss); the lowest when nothing was held out."""
    return report.holdout_score or (-float("inf"), -float("inf"))


#: how a site fits a convex model: ``exact`` (its convex problem solved to a gradient
#: tolerance, :mod:`gems_fl.learning.exact`), ``adam`` (the paper's epochs), or ``auto``
#: (exact where the model says it is measured faster: :attr:`ModelKind.exact_solve`)
class LocalSolve(StrEnum):
    """``local-solve``: how a site fits its convex model."""

    AUTO = "auto"
    EXACT = "exact"
    ADAM = "adam"


LOCAL_SOLVES = tuple(m.value for m in LocalSolve)


@dataclass(frozen=True)
class LocalTraining:
    """How a node builds and trains its local model: the model kind, its hidden widths
    and dropout (MLP), the recipe it is trained with until convergence, and whether a
    convex model is solved exactly instead (``solve``, one of :data:`LOCAL_SOLVES`)."""

    model: str
    hidden: tuple[int, ...]
    dropout: float
    recipe: TrainRecipe
    solve: str = "auto"

    def __post_init__(self) -> None:
        if self.solve not in LOCAL_SOLVES:
            raise ValueError(f"solve={self.solve!r} is not one of {', '.join(LOCAL_SOLVES)}")

    @property
    def exact(self) -> bool:
        """Whether the local model is solved exactly: a convex model with ``solve='exact'``,
        or ``'auto'`` where the model's :attr:`~ModelKind.exact_solve` says so (the MLP
        always trains by epochs)."""
        from gems_fl.learning.model_kinds import model_kind

        kind = model_kind(self.model)
        return kind.convex and (self.solve == LocalSolve.EXACT or (self.solve == LocalSolve.AUTO and kind.exact_solve))

    def new_model(self, num_features: int, num_classes: int,
                  hidden: list[int] | tuple[int, ...] | None = None) -> nn.Module:
        """A fresh model; ``hidden`` overrides the configured widths (merged layers)."""
        from gems_fl.learning.models import build_model

        widths = list(self.hidden if hidden is None else hidden)
        return build_model(self.model, num_features, num_classes, widths, self.dropout)
