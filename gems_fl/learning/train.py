"""Local training, fine-tuning and evaluation (Adam, cross-entropy, mini-batches; plain
SGD for the FedAvg-SGD baselines)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from gems_fl.learning.threads import single_thread
from gems_fl.learning.train_cache import cached_training

LOSS_TOL = 1e-3
OPTIMIZERS = ("adam", "sgd")  # sgd: plain torch.optim.SGD (no momentum, no weight decay)


@dataclass
class TrainReport:
    """What a training call did: epochs run and training accuracy after each."""

    epochs: int = 0
    train_accuracy: list[float] = field(default_factory=list)
    stopped_by: str = ""


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
    """Predicted class per row of ``x``."""
    model.eval()
    xt = torch.as_tensor(x, dtype=torch.float32)
    out = [model(xt[i : i + batch_size]).argmax(dim=1) for i in range(0, len(xt), batch_size)]
    return torch.cat(out).numpy() if out else np.empty(0, dtype=np.int64)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of ``x`` classified as ``y``."""
    if len(y) == 0:
        raise ValueError("cannot compute accuracy on an empty set")
    return float(np.mean(predict(model, x) == np.asarray(y)))


@single_thread()
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
) -> TrainReport:
    if len(y) == 0:
        raise ValueError("cannot train on an empty set")
    xt, yt = _tensors(x, y)
    gen = torch.Generator().manual_seed(seed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    opt = (torch.optim.SGD(trainable, lr=lr) if optimizer == "sgd"
           else torch.optim.Adam(trainable, lr=lr))
    anchor = [p.detach().clone() for p in trainable] if proximal_mu > 0 else None
    loss_fn = nn.CrossEntropyLoss()
    report = TrainReport(stopped_by="max-epochs")
    best_acc, best_loss, since_best = -1.0, float("inf"), 0
    for _ in range(max_epochs):
        model.train()
        order = torch.randperm(len(yt), generator=gen)
        total = 0.0
        for start in range(0, len(yt), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xt[idx]), yt[idx])
            if anchor is not None:  # FedProx: (mu / 2) * ||w - w_round_start||^2
                loss = loss + proximal_mu / 2 * sum(
                    (p - a).pow(2).sum() for p, a in zip(trainable, anchor))
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        epoch_loss = total / len(yt)
        report.epochs += 1
        acc = accuracy(model, x, y)
        report.train_accuracy.append(acc)
        if patience is None:
            continue
        # A flat accuracy while the loss still falls fast is a plateau, not convergence
        # (e.g. a 2-class node predicting one class for a few epochs).
        improving = acc > best_acc or epoch_loss < best_loss - LOSS_TOL
        best_acc, best_loss = max(best_acc, acc), min(best_loss, epoch_loss)
        since_best = 0 if improving else since_best + 1
        if since_best >= patience:
            report.stopped_by = "converged"
            break
    return report


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
) -> TrainReport:
    """Train until training accuracy has converged, at most ``max_epochs`` epochs.

    Converged means: for ``patience`` epochs in a row, neither did the training
    accuracy reach a new best nor did the epoch's mean loss fall more than
    ``LOSS_TOL`` below its best. Shuffling uses a generator seeded with ``seed``.
    With ``GEMS_FL_TRAIN_CACHE`` set, a repeated identical call is served from disk
    (see :mod:`gems_fl.learning.train_cache`).
    """
    return cached_training(
        _run_epochs, model, x, y, lr=lr, batch_size=batch_size, max_epochs=max_epochs,
        patience=patience, seed=seed,
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
) -> TrainReport:
    """Update the trainable weights of ``model`` for exactly ``epochs`` epochs.

    No early stop. ``proximal_mu > 0`` adds FedProx's proximal term, which pulls the
    weights towards where they were when the call started. ``optimizer`` is ``adam``
    (a fresh Adam per call) or ``sgd`` (plain SGD at ``lr``).
    """
    if epochs == 0:
        return TrainReport(stopped_by="no-epochs")
    return _run_epochs(
        model, x, y, lr=lr, batch_size=batch_size, max_epochs=epochs,
        patience=None, seed=seed, proximal_mu=proximal_mu, optimizer=optimizer,
    )
