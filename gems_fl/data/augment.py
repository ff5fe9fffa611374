"""Seeded image augmentation with Pillow: random rotation, width/height shift, flips.

The paper balanced HAM10000 with Keras' random rotations, width and height shifts and
vertical and horizontal flips. This is the same family of transformations done with
Pillow (always installed with matplotlib), so it runs without torchvision and gives
the same images for the same seed on every machine. The image is reflect-padded before
the affine transform and cropped back, so rotated and shifted corners are filled with
mirrored skin instead of black.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

MAX_ROTATION_DEG = 20.0
MAX_SHIFT_FRACTION = 0.1


@dataclass(frozen=True)
class Transform:
    """One draw of the random transformation."""

    angle_deg: float
    shift_x: float  # fraction of the width
    shift_y: float  # fraction of the height
    flip_h: bool
    flip_v: bool


def draw_transform(rng: np.random.Generator) -> Transform:
    """Draw a rotation in +-20 degrees, shifts in +-10 % and two fair coin flips."""
    angle = float(rng.uniform(-MAX_ROTATION_DEG, MAX_ROTATION_DEG))
    shift_x, shift_y = (float(v) for v in rng.uniform(-MAX_SHIFT_FRACTION, MAX_SHIFT_FRACTION, size=2))
    flip_h, flip_v = (bool(v) for v in rng.random(2) < 0.5)
    return Transform(angle, shift_x, shift_y, flip_h, flip_v)


def apply_transform(image: np.ndarray, t: Transform) -> np.ndarray:
    """Apply ``t`` to a uint8 ``(height, width, 3)`` image; same shape and dtype out."""
    height, width = image.shape[:2]
    pad_y, pad_x = height // 2, width // 2
    padded = np.pad(image, ((pad_y, pad_y), (pad_x, pad_x), (0, 0)), mode="reflect")
    big = Image.fromarray(padded)
    # Inverse map of "rotate about the centre by angle, then shift": output -> input pixel.
    cx, cy = big.width / 2.0, big.height / 2.0
    a = math.radians(t.angle_deg)
    cos, sin = math.cos(a), math.sin(a)
    tx, ty = t.shift_x * width, t.shift_y * height
    coeffs = (
        cos, sin, cx - cos * (cx + tx) - sin * (cy + ty),
        -sin, cos, cy + sin * (cx + tx) - cos * (cy + ty),
    )
    moved = big.transform(big.size, Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    out = np.asarray(moved)[pad_y:pad_y + height, pad_x:pad_x + width]
    if t.flip_h:
        out = out[:, ::-1]
    if t.flip_v:
        out = out[::-1]
    return np.ascontiguousarray(out)


def augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random augmented copy of ``image`` drawn with ``rng``."""
    return apply_transform(image, draw_transform(rng))
