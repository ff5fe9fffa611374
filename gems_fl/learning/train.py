"""Local training, fine-tuning and evaluation (Adam, cross-entropy, mini-batches; plain
SGD for the FedAvg-SGD baselines).

Training runs on the process's compute device (the ``device`` setting, see
:func:`set_default_device`): the model and the data move there for the call, and the
model is back on the CPU when it returns, so every caller keeps working on CPU tensors
and numpy arrays. Prediction and evaluation stay on the CPU.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn

from gems_fl.learning.threads import compute_threads
from gems_fl.learning.train_cache import cached_training

LOSS_TOL = 1e-3
OPTIMIZERS = ("adam", "sgd")  # sgd: plain torch.optim.SGD (no momentum, no weight decay)
DEVICES = ("auto", "cpu", "cuda")
_default_device = "auto"


def resolve_device(name: str) -> torch.device:
    """The torch device of a ``device`` setting: ``auto`` (CUDA when available), ``cpu``, ``cuda``.

    ``cuda`` (or ``cuda:N``) without a usable CUDA device raises a ``ValueError`` that
    names the setting and the fix.
    """
    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={name!r}: this machine has no usable CUDA device (torch "
                f"{torch.__version__}, torch.cuda.is_available() is False); use "
                "device='cpu', or device='auto' to use CUDA only where there is one"
            )
        device = torch.device(text)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={name!r}: there are only {torch.cuda.device_count()} CUDA devices"
            )
        return device
    raise ValueError(f"device={name!r} is not one of {', '.join(DEVICES)} (or 'cuda:N')")


def set_default_device(name: str) -> torch.device:
    """Set the device of every later training call in this process; returns it resolved.

    Call once per process with the run's ``device`` setting (a node when it gets its
    settings, the server at start). Raises like :func:`resolve_device`, so a bad value
    fails at once.
    """
    global _default_device
    device = resolve_device(name)
    _default_device = str(name).strip().lower()
    return device


def default_device() -> torch.device:
    """The device training calls use: the last :func:`set_default_device`, else ``auto``."""
    return resolve_device(_default_device)


@dataclass
class TrainReport:
    """What a training call did: epochs run and training accuracy after each."""

    epochs: int = 0
    train_accuracy: list[float] = field(default_factory=list)
    stopped_by: str = ""
    best_epoch: int | None = None  # held-out early stopping: the epoch whose weights were kept
    holdout_score: tuple[float, float] | None = None  # its held-out (accuracy, -loss)
    shrink: float | None = None  # the factor the kept start was shrunk by
    layers: str | None = None  # a trained MLP's tuning: the layers it updated (last / all)
    fresh: bool = False  # the held-out rows preferred a fresh model trained to convergence
    rival_score: tuple[float, float] | None = None  # tune-or-fresh: the one not kept, held out


def as_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)


@torch.no_grad()
def _predict_tensor(model: nn.Module, xt: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    model.eval()
    out = [model(xt[i : i + batch_size]).argmax(dim=1) for i in range(0, len(xt), batch_size)]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long, device=xt.device)


def predict(model: nn.Module, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
    """Predicted class per row of ``x`` (on the model's device; numpy on the CPU)."""
    param = next(model.parameters(), None)
    xt = torch.as_tensor(x, dtype=torch.float32)
    if param is not None and param.device != xt.device:
        xt = xt.to(param.device)
    return _predict_tensor(model, xt, batch_size).cpu().numpy()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of ``x`` classified as ``y``."""
    if len(y) == 0:
        raise ValueError("cannot compute accuracy on an empty set")
    return float(np.mean(predict(model, x) == np.asarray(y)))


@compute_threads()  # the policy's count (1): see gems_fl.learning.threads
def _run_epochs(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    lr: float,
    batch_size: int,
    max_epochs: int,
    patience: int | None,
    seed: int,
    proximal_mu: float = 0.0,
    optimizer: str = "adam",
    device: str | None = None,
    holdout: tuple[np.ndarray, np.ndarray] | None = None,
) -> TrainReport:
    if len(y) == 0:
        raise ValueError("cannot train on an empty set")
    device = default_device() if device is None else resolve_device(device)
    model.to(device)
    try:
        return _epochs_on(model, x, y, device, lr=lr, batch_size=batch_size,
                          max_epochs=max_epochs, patience=patience, seed=seed,
                          proximal_mu=proximal_mu, optimizer=optimizer,
                          holdout=None if holdout is None else
                          tuple(t.to(device) for t in as_tensors(*holdout)))
    finally:
        model.to("cpu")


def _optimizer(model: nn.Module, optimizer: str,
               lr: float) -> tuple[list[nn.Parameter], torch.optim.Optimizer]:
    """The trainable parameters and the optimizer (``"adam"`` or ``"sgd"``) over them."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    return trainable, (torch.optim.SGD(trainable, lr=lr) if optimizer == "sgd"
                       else torch.optim.Adam(trainable, lr=lr))


def _batch_step(model: nn.Module, opt: torch.optim.Optimizer, loss_fn: nn.Module,
                trainable: list[nn.Parameter], anchor: list[torch.Tensor] | None,
                proximal_mu: float, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """One optimizer step on a batch; its loss (with FedProx's term where ``anchor``)."""
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(xb), yb)
    if anchor is not None:  # FedProx: (mu / 2) * ||w - w_round_start||^2
        loss = loss + proximal_mu / 2 * sum(
            (p - a).pow(2).sum() for p, a in zip(trainable, anchor))
    loss.backward()
    opt.step()
    return loss


class _Plateau:
    """Epochs since the training accuracy or loss last improved. A flat accuracy while the
    loss still falls fast is a plateau, not convergence (e.g. a 2-class node predicting
    one class for a few epochs)."""

    def __init__(self) -> None:
        self.best_acc, self.best_loss, self.since_best = -1.0, float("inf"), 0

    def update(self, acc: float, loss: float) -> int:
        improving = acc > self.best_acc or loss < self.best_loss - LOSS_TOL
        self.best_acc, self.best_loss = max(self.best_acc, acc), min(self.best_loss, loss)
        self.since_best = 0 if improving else self.since_best + 1
        return self.since_best


def _epochs_on(
    model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device, *, lr: float,
    batch_size: int, max_epochs: int, patience: int | None, seed: int, proximal_mu: float,
    optimizer: str = "adam", holdout: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> TrainReport:
    xt, yt = (t.to(device) for t in as_tensors(x, y))
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same order on every device
    on_cpu = device.type == "cpu"
    trainable, opt = _optimizer(model, optimizer, lr)
    anchor = [p.detach().clone() for p in trainable] if proximal_mu > 0 else None
    step = partial(_batch_step, model, opt, nn.CrossEntropyLoss(), trainable, anchor,
                   proximal_mu)
    report = TrainReport(stopped_by="max-epochs")
    plateau = _Plateau()
    if holdout is not None:  # the weights before any epoch are a candidate too
        keeper = HoldoutKeeper(model, *holdout)
    for _ in range(max_epochs):
        model.train()
        order = torch.randperm(len(yt), generator=gen).to(device)
        total = 0.0 if on_cpu else torch.zeros((), dtype=torch.float64, device=device)
        for start in range(0, len(yt), batch_size):
            idx = order[start : start + batch_size]
            loss = step(xt[idx], yt[idx])
            if on_cpu:
                total += float(loss.detach()) * len(idx)
            else:  # the same float64 sum, without a device sync per step
                total += loss.detach().double() * len(idx)
        epoch_loss = float(total) / len(yt)
        report.epochs += 1
        acc = int((_predict_tensor(model, xt) == yt).sum()) / len(yt)
        report.train_accuracy.append(acc)
        if holdout is not None:
            if keeper.update(model, report.epochs) >= patience:
                break
            continue
        if patience is not None and plateau.update(acc, epoch_loss) >= patience:
            report.stopped_by = "converged"
            break
    if holdout is not None:
        keeper.restore(model)
        report.best_epoch = keeper.best_epoch
        report.holdout_score = keeper.best
        report.stopped_by = "holdout"
    return report


class HoldoutKeeper:
    """The weights with the best held-out accuracy so far (ties: the lower loss).

    Patience counts epochs in which neither the held-out accuracy reached a new best nor
    the held-out loss fell below its best: a start that is far off (a model that has never
    seen some classes) improves its loss for many epochs before its accuracy moves, and
    stopping on accuracy alone ends such a tuning on a plateau.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.best: tuple[float, float] = (-1.0, float("inf"))
        self.lowest_loss = float("inf")
        self.best_epoch, self.since = 0, 0
        self.state: dict[str, torch.Tensor] = {}
        self.update(model, 0)

    def update(self, model: nn.Module, epoch: int) -> int:
        """Score ``model``; keep it if it is the best. Returns epochs since the best."""
        score = heldout_score(model, self.x, self.y)
        improved = False
        if score[0] > self.best[0] or (score[0] == self.best[0] and score[1] > self.best[1]):
            self.best, self.best_epoch, improved = score, epoch, True
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if -score[1] < self.lowest_loss - LOSS_TOL:
            self.lowest_loss, improved = -score[1], True
        self.since = 0 if improved else self.since + 1
        return self.since

    def restore(self, model: nn.Module) -> None:
        model.load_state_dict(self.state)


@torch.no_grad()
def heldout_score(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``model``'s (accuracy, -cross-entropy) on held-out rows: the order tunings compare."""
    model.eval()
    logits = model(x)
    return (float((logits.argmax(dim=1) == y).float().mean()),
            -float(nn.functional.cross_entropy(logits, y)))


def holdout_split(num_rows: int, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows a held-out tuning trains on and the rows it scores on (seeded; at least one
    of each). Every held-out choice of one tuning uses this split, so they compare alike."""
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction={holdout_fraction} must lie in (0, 1)")
    order = np.random.default_rng(seed).permutation(num_rows)
    held = min(num_rows - 1, max(1, int(round(holdout_fraction * num_rows))))
    return order[held:], order[:held]


def converged_holdout_score(
    model: nn.Module, x: np.ndarray, y: np.ndarray, *, holdout_fraction: float, lr: float,
    batch_size: int, max_epochs: int, patience: int, seed: int, device: str | None = None,
) -> tuple[float, float]:
    """Train ``model`` in place until convergence (as :func:`train_until_converged`) on the
    rows :func:`holdout_split` keeps, and return its held-out (accuracy, -loss): the score
    a fresh model trained to convergence earns in the same comparison as the tunings."""
    keep, hold = holdout_split(len(y), holdout_fraction, seed)
    train_until_converged(model, x[keep], y[keep], lr=lr, batch_size=batch_size,
                          max_epochs=max_epochs, patience=patience, seed=seed, device=device)
    return heldout_score(model, *as_tensors(x[hold], y[hold]))


def fine_tune_holdout(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    max_epochs: int,
    patience: int,
    holdout_fraction: float,
    lr: float,
    batch_size: int,
    seed: int,
    device: str | None = None,
    refit: bool = True,
    shrinks: tuple[float, ...] = (1.0,),
) -> TrainReport:
    """Fine-tune on part of ``(x, y)`` and keep the weights that do best on the rest.

    A seeded ``holdout_fraction`` of the rows (at least one) is held out; the model is
    tuned on the others with Adam, and after every epoch scored on the held-out rows
    (accuracy, ties broken by cross-entropy). Training stops after ``patience`` epochs in
    which neither the held-out accuracy nor the held-out loss improved, or after
    ``max_epochs``. The weights before tuning are a candidate too, so tuning never makes
    the model worse on the held-out rows. Each factor of ``shrinks`` is tried: the start's
    trainable weights scaled by it, then tuned as above; the held-out rows pick the
    factor. ``refit``: the picked start is then tuned for the picked number of epochs on
    every row (the report keeps the held-out run's figures); otherwise the held-out run's
    best weights are kept. Fewer than 2 rows: tuning is skipped.
    """
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction={holdout_fraction} must lie in (0, 1)")
    if len(y) < 2 or max_epochs == 0:
        return TrainReport(stopped_by="too-few-rows" if len(y) < 2 else "no-epochs")
    keep, hold = holdout_split(len(y), holdout_fraction, seed)
    if not shrinks or any(not 0 <= f <= 1 for f in shrinks):
        raise ValueError(f"shrinks={shrinks} must be factors in [0, 1], at least one")
    original = copy.deepcopy(model.state_dict())
    best: tuple[TrainReport, dict] | None = None  # the report and its tuned weights
    for factor in shrinks:
        model.load_state_dict(original)
        _shrink_trainable(model, factor)
        report = _run_epochs(model, x[keep], y[keep], lr=lr, batch_size=batch_size,
                             max_epochs=max_epochs, patience=patience, seed=seed, device=device,
                             holdout=(x[hold], y[hold]))
        report.shrink = factor
        if best is None or report.holdout_score > best[0].holdout_score:  # ties: larger factor
            best = (report, copy.deepcopy(model.state_dict()))
    report, tuned = best
    if not refit or not report.best_epoch:
        model.load_state_dict(tuned)
        return report
    # The held-out rows chose the start and how long to tune; the model is then tuned
    # that long from that start on every row, so the holdout costs the tuned model no data.
    model.load_state_dict(original)
    _shrink_trainable(model, report.shrink)
    fine_tune(model, x, y, epochs=report.best_epoch, lr=lr, batch_size=batch_size, seed=seed,
              device=device)
    report.stopped_by = "holdout-refit"
    return report


@torch.no_grad()
def _shrink_trainable(model: nn.Module, factor: float) -> None:
    """Scale the trainable weights by ``factor`` (a warm start shrunk towards zero)."""
    if factor != 1:
        for p in model.parameters():
            if p.requires_grad:
                p.mul_(factor)


def train_until_converged(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    lr: float,
    batch_size: int,
    max_epochs: int,
    patience: int,
    seed: int,
    device: str | None = None,
) -> TrainReport:
    """Train until training accuracy has converged, at most ``max_epochs`` epochs.

    Converged means: for ``patience`` epochs in a row, neither did the training
    accuracy reach a new best nor did the epoch's mean loss fall more than
    ``LOSS_TOL`` below its best. Shuffling uses a generator seeded with ``seed``.
    With ``GEMS_FL_TRAIN_CACHE`` set, a repeated identical call is served from disk
    (see :mod:`gems_fl.learning.train_cache`). ``device`` (a ``device`` setting)
    overrides the process default of :func:`set_default_device` for this call.
    """
    extra = {} if device is None else {"device": device}  # None keeps old cache keys
    return cached_training(
        _run_epochs, model, x, y, lr=lr, batch_size=batch_size, max_epochs=max_epochs,
        patience=patience, seed=seed, **extra,
    )


def fine_tune(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    proximal_mu: float = 0.0,
    optimizer: str = "adam",
    device: str | None = None,
) -> TrainReport:
    """Update the trainable weights of ``model`` for exactly ``epochs`` epochs.

    No early stop. ``proximal_mu > 0`` adds FedProx's proximal term, which pulls the
    weights towards where they were when the call started. ``optimizer`` is ``adam``
    (a fresh Adam per call) or ``sgd`` (plain SGD at ``lr``). ``device`` as in
    :func:`train_until_converged`.
    """
    if epochs == 0:
        return TrainReport(stopped_by="no-epochs")
    return _run_epochs(
        model, x, y, lr=lr, batch_size=batch_size, max_epochs=epochs,
        patience=None, seed=seed, proximal_mu=proximal_mu, optimizer=optimizer,
        device=device,
    )
