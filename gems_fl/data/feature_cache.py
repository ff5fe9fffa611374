"""On-disk cache of extracted features, and batched extraction with a progress bar.

An entry is one ``.npz`` file named by a key that the caller derives from everything
the features depend on (the data files' contents, the extractor's weights, seeds).
Writers hold an exclusive lock on ``<key>.lock`` so that nodes starting together
compute an entry once; the file appears atomically (written aside, then renamed).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

try:  # POSIX only; without it concurrent first runs merely compute twice.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gems-fl/features``, or ``~/.cache/gems-fl/features``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gems-fl" / "features"


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    """The cache folder: ``cache_dir`` if given (non-empty), else :func:`default_cache_dir`."""
    if cache_dir is None or not str(cache_dir).strip():
        return default_cache_dir()
    return Path(cache_dir).expanduser().resolve()


def fingerprint(*parts: object) -> str:
    """Short SHA-256 hex digest of the ``repr`` of ``parts`` (bytes are hashed as they are)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:32]


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def cached(
    cache_dir: Path, name: str, key: str, compute: Callable[[], dict[str, np.ndarray]]
) -> tuple[dict[str, np.ndarray], Path, bool]:
    """Return the arrays stored under ``<cache_dir>/<name>-<key>.npz``, computing them once.

    Returns
    -------
    arrays, path, hit
        The arrays, the cache file, and whether they were read from it.
    """
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(
            f"feature cache folder {str(cache_dir)!r} cannot be created ({exc}); set the run "
            "setting `feature-cache-dir` to a writable folder."
        ) from None
    path = cache_dir / f"{name}-{key}.npz"
    with _locked(cache_dir / f"{name}-{key}.lock"):
        if path.is_file():
            with np.load(path) as stored:
                arrays = {k: stored[k] for k in stored.files}
            logger.info("features read from cache %s", path)
            return arrays, path, True
        arrays = compute()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
        logger.info("features written to cache %s", path)
        return arrays, path, False


def extract_features(
    model: torch.nn.Module,
    images: np.ndarray,
    prepare: Callable[[np.ndarray], torch.Tensor],
    description: str,
    batch_size: int = 256,
    device: str = "cpu",
) -> np.ndarray:
    """Run ``model`` over ``images`` in batches under ``torch.no_grad`` with a progress bar.

    ``prepare`` turns a slice of ``images`` into the model's input tensor. The model runs
    on ``device`` (a ``device`` setting: ``auto``, ``cpu``, ``cuda``) and is back on the
    CPU afterwards. Returns float32 features of shape ``(len(images), d)``.
    """
    from rich.progress import track

    from gems_fl.learning.train import resolve_device

    target = resolve_device(device)
    model.eval()
    model.to(target)
    outputs = []
    starts = range(0, len(images), batch_size)
    try:
        with torch.no_grad():
            for start in track(starts, description=description, total=len(starts), transient=True):
                out = model(prepare(images[start:start + batch_size]).to(target)).cpu()
                outputs.append(out.reshape(len(out), -1).numpy().astype(np.float32, copy=False))
    finally:
        model.to("cpu")
    if not outputs:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(outputs)
