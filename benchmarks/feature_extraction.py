"""Benchmark: CPU cost of CIFAR-10 and HAM10000 feature extraction, extrapolated.

    python benchmarks/feature_extraction.py                  # defaults below
    python benchmarks/feature_extraction.py --vgg-images 500 --ham-images 300

Prints a table and writes results/benchmarks/feature_extraction.json.

The real datasets are not on this machine, so each step is timed on generated inputs
of the real sizes and the time per image is multiplied by the real counts; the totals
are extrapolations, not measurements of a full run.

- CIFAR-10: VGG-16 convolutional features (random He-initialised weights: the same
  arithmetic as the ImageNet weights) on ``--vgg-images`` random 32x32 images, batches
  of 256; extrapolated to 60000 images.
- HAM10000, per step of gems_fl.data.ham10000:
  decoding + resizing ``--ham-jpegs`` generated 600x450 JPEGs (the published size),
  extrapolated to 10015; augmenting 64x64 images, extrapolated to the number of
  augmented copies the real class counts need for 2000 per class; one epoch of the
  feature CNN on ``--ham-images`` 64x64 images, extrapolated to 10 epochs on 66 % of
  14000 (9240) images; CNN feature extraction, extrapolated to 14000 images.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

from gems_fl.data.augment import augment
from gems_fl.data.cifar10 import vgg_input
from gems_fl.data.feature_cache import extract_features
from gems_fl.data.ham10000 import (
    DIAGNOSES,
    EXTRACTOR_FRACTION,
    cnn_input,
    decode_image,
    split_counts,
    train_extractor,
)
from gems_fl.data.vgg16 import VGG16Features

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--vgg-images", "2", "--ham-jpegs", "2", "--ham-images", "8"]]


CIFAR10_IMAGES = 60000
HAM10000_IMAGES = 10015
# Published HAM10000 class counts (akiec, bcc, bkl, df, mel, nv, vasc).
HAM10000_COUNTS = dict(zip(DIAGNOSES, (327, 514, 1099, 115, 1113, 6705, 142)))
PER_CLASS = 2000
CNN_EPOCHS = 10


def augmented_copies_needed(counts: dict[str, int], per_class: int) -> int:
    """Augmented images gems_fl.data.ham10000.balanced_split makes for these class counts."""
    targets = split_counts(per_class)
    total = 0
    for n in counts.values():
        for name, have in split_counts(n).items():
            total += max(0, targets[name] - have)
    return total


def time_vgg(n: int) -> float:
    torch.manual_seed(0)
    model = VGG16Features()
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    images = np.random.default_rng(0).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    start = time.perf_counter()
    feats = extract_features(model, images, vgg_input, "VGG-16")
    elapsed = time.perf_counter() - start
    assert feats.shape == (n, 512)
    return elapsed


def time_decode(n: int, tmp: Path) -> float:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        pixels = rng.integers(0, 256, (450, 600, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        paths.append(tmp / f"img{i}.jpg")
        paths[-1].write_bytes(buffer.getvalue())
    start = time.perf_counter()
    for path in paths:
        decode_image(path)
    return time.perf_counter() - start


def time_augment(n: int) -> float:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8)
    start = time.perf_counter()
    for image in images:
        augment(image, rng)
    return time.perf_counter() - start


def time_cnn(n: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8)
    labels = rng.integers(0, 7, n)
    start = time.perf_counter()
    extractor = train_extractor(images, labels, epochs=1, seed=0)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    extract_features(extractor, images, cnn_input, "CNN features")
    return train_s, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vgg-images", type=int, default=2000)
    parser.add_argument("--ham-jpegs", type=int, default=200)
    parser.add_argument("--ham-images", type=int, default=1000)
    parser.add_argument("--out", default=default_out("feature_extraction"))
    args = parser.parse_args()

    import tempfile

    vgg_s = time_vgg(args.vgg_images)
    with tempfile.TemporaryDirectory() as tmp:
        decode_s = time_decode(args.ham_jpegs, Path(tmp))
    augment_s = time_augment(args.ham_images)
    train_s, extract_s = time_cnn(args.ham_images)

    ham_total = PER_CLASS * len(DIAGNOSES)
    fit_images = round(EXTRACTOR_FRACTION * ham_total)
    copies = augmented_copies_needed(HAM10000_COUNTS, PER_CLASS)
    rows = [
        ("CIFAR-10: VGG-16 features", args.vgg_images, vgg_s, CIFAR10_IMAGES, "images"),
        ("HAM10000: decode + resize JPEGs (600x450 -> 64x64)", args.ham_jpegs, decode_s, HAM10000_IMAGES, "images"),
        ("HAM10000: augment (rotate, shift, flip)", args.ham_images, augment_s, copies, "copies"),
        ("HAM10000: train feature CNN", args.ham_images, train_s, fit_images * CNN_EPOCHS, "image-epochs"),
        ("HAM10000: CNN features", args.ham_images, extract_s, ham_total, "images"),
    ]
    table = Table(title=f"Feature extraction on CPU ({os.cpu_count()} cores, torch threads "
                        f"{torch.get_num_threads()}); totals are extrapolations")
    for col in ("step", "measured on", "seconds", "ms per item", "full dataset", "extrapolated seconds"):
        table.add_column(col, justify="left" if col == "step" else "right")
    records = []
    for name, n, seconds, full, unit in rows:
        per = seconds / n
        records.append({"step": name, "measured_items": n, "seconds": seconds, "seconds_per_item": per,
                        "full_items": full, "unit": unit, "extrapolated_seconds": per * full})
        table.add_row(name, f"{n}", f"{seconds:.2f}", f"{1000 * per:.2f}", f"{full} {unit}", f"{per * full:.0f}")
    ham_sum = sum(r["extrapolated_seconds"] for r in records[1:])
    table.add_row("HAM10000: all steps", "", "", "", "", f"{ham_sum:.0f}")
    Console(width=160).print(table)
    out = write_envelope("feature_extraction", args.out, {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "torch": torch.__version__},
        "args": vars(args), "rows": records, "ham10000_total_extrapolated_seconds": ham_sum,
        "ham10000_augmented_copies": copies, "ham10000_cnn_fit_images": fit_images})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
