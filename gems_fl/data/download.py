"""Optional torchvision downloads for datasets whose files are missing."""

from __future__ import annotations

import importlib
from pathlib import Path


def try_torchvision_download(data_dir: Path, dataset: str = "MNIST") -> str:
    """Try to download ``torchvision.datasets.<dataset>`` into ``data_dir``.

    Returns a sentence for the error message when the files are still missing.
    """
    try:
        tv_datasets = importlib.import_module("torchvision.datasets")
    except Exception:  # noqa: BLE001 - ImportError, or a torchvision that fails to load
        return "torchvision is not importable, so no automatic download was attempted."
    try:
        getattr(tv_datasets, dataset)(root=str(data_dir), download=True)
    except Exception as exc:  # noqa: BLE001 - any failure just means "not downloaded"
        return f"An automatic download with torchvision failed: {exc!r}."
    return "torchvision reported a successful download, but the files are still missing."
