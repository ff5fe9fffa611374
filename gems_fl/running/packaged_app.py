"""The Flower app the installed package carries, for ``gems-fl run`` and ``submit`` from a
folder that holds no Flower app (the user's own data folder, an empty one).

Its ``pyproject.toml`` is written from the settings' declarations (the same defaults as
the checkout's ``[tool.flwr.app.config]``, which a test keeps equal) and names the apps
of :mod:`gems_fl.apps`, imported from the installed package.
"""

from __future__ import annotations

import hashlib
import tempfile
import tomllib
from dataclasses import fields
from pathlib import Path

import tomli_w

from gems_fl.settings import LAB_KEY, Settings
from gems_fl.settings.checks import key_of

PUBLISHER = "gems-fl"
COMPONENTS = {"serverapp": "gems_fl.apps:server_app", "clientapp": "gems_fl.apps:client_app"}


def is_flower_app(folder: Path) -> bool:
    """Whether ``folder`` holds a Flower app (a ``pyproject.toml`` with ``[tool.flwr.app]``)."""
    path = folder / "pyproject.toml"
    if not path.is_file():
        return False
    try:
        return "app" in tomllib.loads(path.read_text()).get("tool", {}).get("flwr", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False


def app_pyproject() -> dict:
    """The packaged app's ``pyproject.toml``: every product setting at its default, and the
    empty ``lab`` text (the research switches at theirs)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("gems-fl")
    except PackageNotFoundError:
        release = "0.0.0"
    return {
        "project": {"name": "gems-fl-app", "version": release, "license": "Apache-2.0",
                    "description": "GEMS as a Flower app (the one the gems-fl package carries)"},
        "tool": {"flwr": {"app": {"publisher": PUBLISHER, "components": COMPONENTS,
                                  "config": {**{key_of(f): f.default for f in fields(Settings)
                                                if not f.metadata["lab"]}, LAB_KEY: ""}}}},
    }


def packaged_app(folder: Path | None = None) -> Path:
    """A folder holding the packaged app (written once per content, in the system's temp
    folder unless ``folder`` is given)."""
    text = tomli_w.dumps(app_pyproject())
    if folder is None:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / f"gems-fl-app-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pyproject.toml"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return folder


def resolve_app(app_dir: str | Path | None) -> tuple[Path, bool]:
    """The app folder to run, and whether it is the packaged one: ``app_dir`` when given;
    else the current folder when it holds a Flower app (a checkout), else the packaged app."""
    if app_dir is not None:
        return Path(app_dir).expanduser().resolve(), False
    here = Path.cwd()
    if is_flower_app(here):
        return here, False
    return packaged_app(), True
