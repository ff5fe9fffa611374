"""The selection round: the nodes score a few candidate models on their validation data,
the server keeps the best by the pooled figures.

What is chosen there and nowhere else: the ridge of the pooled point (``pooled-ridge=auto``:
one candidate per ridge) and the logit scale (temperature) of the model that the run
returns or refines. Nothing here looks at test data: each node scores on its own
validation split and sends counts and mean losses, the server pools them by rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gems_fl.geometry.linalg import augment

#: Logit scales the selection round scores. The pooled least-squares point has logits of
#: order 1 (it regresses one-hot labels); a scale that fits the data's confidence gives
#: calibrated probabilities and a faster first refinement step.
TEMPERATURES = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)


def score_candidates(candidates: np.ndarray, x: np.ndarray, y: np.ndarray,
                     temperatures: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Node side: every candidate on ``(x (N, d), y (N,))`` at every logit scale.

    ``candidates`` is ``(m, C, d + 1)`` (weights with the bias last). Returns the mean
    cross-entropy ``(m, T)`` of ``t W`` for each scale ``t`` and the number of correct
    predictions ``(m,)`` (a scale does not change the argmax). One batched evaluation.
    """
    w = torch.as_tensor(np.asarray(candidates), dtype=torch.float64)
    xa = augment(x)
    if w.ndim != 3 or w.shape[2] != xa.shape[1]:
        raise ValueError(f"candidates must be (m, C, {xa.shape[1]}), got {tuple(w.shape)}")
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long)
    if len(yt) == 0 or len(yt) != len(xa):
        raise ValueError(f"need one label per row and at least one row; got {len(yt)} "
                         f"labels for {len(xa)} rows")
    if int(yt.min()) < 0 or int(yt.max()) >= w.shape[1]:
        raise ValueError(f"labels must lie in [0, {w.shape[1]})")
    logits = torch.einsum("mcn,bn->mbc", w, xa)  # (m, N, C)
    scales = torch.as_tensor(list(temperatures), dtype=torch.float64).view(1, -1, 1, 1)
    logp = torch.log_softmax(scales * logits.unsqueeze(1), dim=3)  # (m, T, N, C)
    index = yt.view(1, 1, -1, 1).expand(logp.shape[0], logp.shape[1], -1, 1)
    losses = -logp.gather(3, index).squeeze(3).mean(dim=2)
    correct = (logits.argmax(dim=2) == yt.view(1, -1)).sum(dim=1)
    return losses.numpy(), correct.numpy()


@dataclass(frozen=True)
class Selection:
    """What the server chose from the nodes' scores."""

    index: int  # the candidate kept
    temperature: float  # its logit scale with the lowest pooled validation cross-entropy
    val_accuracy: np.ndarray  # (m,) pooled validation accuracy per candidate
    val_loss: np.ndarray  # (m, T) pooled validation cross-entropy


def choose_candidate(losses: Sequence[np.ndarray], correct: Sequence[np.ndarray],
                     rows: Sequence[int], temperatures: Sequence[float]) -> Selection:
    """Server side: pool the nodes' scores by rows and choose.

    The candidate with the highest pooled validation accuracy is kept (ties: the lower
    cross-entropy at its best scale); its scale is the one with the lowest pooled
    validation cross-entropy.
    """
    n = np.asarray(rows, dtype=np.float64)
    if len(losses) == 0 or len(losses) != len(correct) or n.shape != (len(losses),) \
            or np.any(n <= 0):
        raise ValueError("pass one loss matrix, one count vector and one positive row "
                         "count per node")
    loss = np.tensordot(n / n.sum(), np.stack([np.asarray(v, np.float64) for v in losses]), 1)
    acc = np.sum(np.stack([np.asarray(c, np.float64) for c in correct]), axis=0) / n.sum()
    if loss.ndim != 2 or loss.shape[1] != len(temperatures) or acc.shape != (loss.shape[0],):
        raise ValueError(f"scores must be (m, {len(temperatures)}) losses and (m,) counts")
    order = np.lexsort((loss.min(axis=1), -acc))  # accuracy first, then the best loss
    index = int(order[0])
    return Selection(index, float(temperatures[int(np.argmin(loss[index]))]), acc, loss)
