"""The convolutional part of VGG-16 in plain torch, and where its weights come from.

:class:`VGG16Features` has exactly torchvision's module layout (``features`` is an
``nn.Sequential`` with the same indices), so the ``features.*`` entries of torchvision's
``vgg16-397923af.pth`` load into it with strict key checking. torchvision itself is an
optional import: it is only used to fetch the ImageNet weights when no local file is
given and the machine is online.

On a 32x32 image the five 2x2 max-poolings leave a 1x1x512 map: 512 features.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

import torch
from torch import nn

# torchvision's configuration "D" (VGG-16): channel counts, "M" = 2x2 max-pooling.
VGG16_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
# torchvision's ImageNet normalisation for its pretrained weights.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

HOW_TO_GET_WEIGHTS = (
    "Download torchvision's ImageNet VGG-16 weights "
    "(https://download.pytorch.org/models/vgg16-397923af.pth) and give the file with the run "
    "setting `vgg16-weights` (e.g. --run-config \"lab='vgg16-weights=/path/vgg16-397923af.pth'\"); "
    "any state dict with torchvision's `features.*` keys (or the same keys without the "
    "`features.` prefix) works. Alternatively install torchvision on a machine with internet "
    "and leave `vgg16-weights` empty: the weights VGG16_Weights.IMAGENET1K_V1 are then fetched."
)


class VGG16Features(nn.Module):
    """VGG-16's convolutional layers followed by flattening.

    Input: float images ``(n, 3, 32, 32)`` already normalised; output ``(n, 512)``.
    """

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG16_CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, int(item), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = int(item)
        self.features = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.features(x), 1)


def features_state(state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Keep the ``features.*`` entries of a full VGG-16 state dict (or accept bare keys).

    Raises ``ValueError`` naming ``where`` when ``state`` is not a mapping of tensors.
    """
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"VGG-16 weights {where}: expected a state dict (a dict of tensors, as saved by "
            f"torch.save(model.state_dict(), ...)), found {type(state).__name__}. {HOW_TO_GET_WEIGHTS}"
        )
    prefixed = {k[len("features."):]: v for k, v in state.items() if k.startswith("features.")}
    return {f"features.{k}": v for k, v in (prefixed or state).items()}


def load_weights_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a VGG-16 state dict file; raise with the file name and what was expected."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"VGG-16 weights file {str(path)!r} not found. {HOW_TO_GET_WEIGHTS}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same message
        raise ValueError(
            f"VGG-16 weights file {str(path)!r}: expected a torch state dict "
            f"(e.g. torchvision's vgg16-397923af.pth), could not read it: {exc}. {HOW_TO_GET_WEIGHTS}"
        ) from None
    return features_state(state, repr(str(path)))


def _torchvision_weights() -> dict[str, torch.Tensor]:
    """Fetch VGG16_Weights.IMAGENET1K_V1 through torchvision, or raise how to provide them."""
    try:
        models = importlib.import_module("torchvision.models")
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken torchvision install
        raise FileNotFoundError(
            f"No VGG-16 weights: the setting `vgg16-weights` is empty and torchvision cannot be "
            f"imported ({exc!r}). {HOW_TO_GET_WEIGHTS}"
        ) from None
    try:
        state = models.VGG16_Weights.IMAGENET1K_V1.get_state_dict(progress=True)
    except Exception as exc:  # noqa: BLE001 - offline, proxy, disk full ...
        raise FileNotFoundError(
            f"No VGG-16 weights: the setting `vgg16-weights` is empty and torchvision could not "
            f"fetch VGG16_Weights.IMAGENET1K_V1 ({exc!r}). {HOW_TO_GET_WEIGHTS}"
        ) from None
    return features_state(state, "from torchvision")


def load_vgg16_features(weights: str | os.PathLike | None) -> VGG16Features:
    """Build :class:`VGG16Features` in eval mode with the given weights.

    Parameters
    ----------
    weights : str or os.PathLike or None
        A local state dict file; empty or ``None`` fetches the ImageNet weights through
        torchvision (needs torchvision and internet).

    Raises
    ------
    FileNotFoundError
        No weights file and no torchvision download; the message says how to get them.
    ValueError
        The file is not a VGG-16 state dict (wrong keys or shapes are named).
    """
    state = load_weights_file(weights) if weights else _torchvision_weights()
    model = VGG16Features()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        where = repr(str(weights)) if weights else "from torchvision"
        raise ValueError(
            f"VGG-16 weights {where}: expected the `features.*` tensors of torchvision's VGG-16 "
            f"(13 conv layers, 64..512 channels), found other keys or shapes: {exc}"
        ) from None
    return model.eval()


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 of a model's parameters (names, shapes and values): the cache key of its weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
