"""Optional on-disk memo of :func:`gems_fl.learning.train.train_until_converged`.

Training is deterministic (one thread, seeded shuffling), so a call with the same
starting weights, trainable set, data, recipe and seed always ends at the same weights.
The reproduction harness runs many trials that repeat such calls: the Global model is
the same for every K of a seed, a node's local model is the same for the ball and the
ellipsoid trial, and the server's retraining of a node's MLP repeats the node's own.
With ``GEMS_FL_TRAIN_CACHE`` set to a folder, the result of each call is stored there
and a repeated call loads it instead of training again. Unset (the default), nothing is
cached. Results are bit-identical either way: the key covers every input of the call.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

ENV_VAR = "GEMS_FL_TRAIN_CACHE"


def cache_dir() -> Path | None:
    """The cache folder from ``GEMS_FL_TRAIN_CACHE``, or None when caching is off."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value) if value else None


def call_key(model: nn.Module, x: np.ndarray, y: np.ndarray, recipe: dict) -> str:
    """Digest of everything that determines a training call's outcome."""
    h = hashlib.blake2b(digest_size=20)
    h.update(torch.__version__.encode())
    h.update(repr(type(model)).encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    h.update(repr([(n, p.requires_grad) for n, p in model.named_parameters()]).encode())
    h.update(repr(sorted((n, m.p) for n, m in model.named_modules()
                         if isinstance(m, nn.Dropout))).encode())
    for arr in (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y)):
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    h.update(repr(sorted(recipe.items())).encode())
    return h.hexdigest()


def cached_training(
    train: Callable[..., object], model: nn.Module, x: np.ndarray, y: np.ndarray, **recipe
):
    """Run ``train(model, x, y, **recipe)``, or load its stored outcome into ``model``."""
    folder = cache_dir()
    if folder is None:
        return train(model, x, y, **recipe)
    path = folder / f"{call_key(model, x, y, recipe)}.pt"
    if path.exists():
        try:
            stored = torch.load(path, weights_only=False)
            model.load_state_dict(stored["state"])
            return pickle.loads(stored["report"])
        except Exception:  # noqa: BLE001 - a damaged entry is recomputed, never trusted
            path.unlink(missing_ok=True)
    report = train(model, x, y, **recipe)
    folder.mkdir(parents=True, exist_ok=True)
    # Write then rename: a concurrent reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    os.close(fd)
    torch.save({"state": model.state_dict(), "report": pickle.dumps(report)}, tmp)
    os.replace(tmp, path)
    return report
