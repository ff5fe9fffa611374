"""The app's run settings as ``flwr run`` reads them: ``pyproject.toml`` defaults and
``--run-config`` overrides (``key=value`` pairs or a ``.toml`` file), validated before
anything starts."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from gems_fl.settings import LAB_KEY, Settings, lab_keys
from gems_fl.settings.lab import parse_pairs


def app_config(app_dir: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` defaults from its ``pyproject.toml``."""
    path = app_dir / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no pyproject.toml in {app_dir}: pass the app folder")
    with path.open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def parse_run_config(text: str | None) -> dict[str, Any]:
    """``key=value`` pairs (TOML values) or a ``.toml`` file, as ``flwr run`` reads them.

    Raises ``ValueError`` with one line naming the key and showing the quoted form for
    a value that is not valid TOML (``dataset=fashion-mnist``).
    """
    if not text or not text.strip():
        return {}
    text = text.strip()
    if text.endswith(".toml") and "=" not in text:
        path = Path(text).expanduser()
        try:
            with path.open("rb") as f:
                return dict(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"--run-config {text}: cannot read it as TOML ({exc})") from None
    return parse_pairs(text, where="--run-config")


def refuse_unknown(overrides: dict[str, Any], known: Any) -> None:
    """``ValueError`` naming every key of ``overrides`` that is not a run setting, each
    with the closest settings' names (``did you mean``), and where the list is."""
    unknown = sorted(set(overrides) - set(known))
    if not unknown:
        return
    switches = [key for key in unknown if key in lab_keys()]
    if switches and LAB_KEY in known:
        pairs = " ".join(f"{key}={overrides[key]}" for key in switches)
        raise ValueError(f"{', '.join(repr(k) for k in switches)}: research switch(es) of the "
                         f"paper's studies, set inside the one lab setting: --run-config "
                         f"\"lab='{pairs}'\" (docs/settings.md, 'Research switches')")
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        parts.append(f"'{key}'" + (f" (did you mean {' or '.join(repr(c) for c in close)}?)"
                                   if close else ""))
    raise ValueError(f"unknown run setting(s) {', '.join(parts)}; `gems-fl run --help` and "
                     "docs/settings.md list them")


def refuse_unknown_settings(config: dict[str, Any]) -> None:
    """:func:`refuse_unknown` against every run setting (a library call's settings, which
    no app's ``pyproject.toml`` lists)."""
    from dataclasses import fields

    from gems_fl.settings.checks import key_of

    refuse_unknown(config, {key_of(f) for f in fields(Settings)} | {LAB_KEY})


def resolve_overrides(app_dir: Path, run_config: str | None, output_dir: str | None) -> dict[str, Any]:
    """Parse ``key=value`` overrides, validate them, make ``output-dir`` absolute.

    Validation here stops a bad value before any process starts, with the same
    message (naming the key) the ServerApp would give.
    """
    defaults = app_config(app_dir)
    overrides = parse_run_config(run_config)
    refuse_unknown(overrides, defaults)
    if output_dir is not None:
        overrides["output-dir"] = output_dir
    out = overrides.get("output-dir", defaults["output-dir"])
    overrides["output-dir"] = str(Path(out).expanduser().absolute())
    Settings.from_run_config({**defaults, **overrides})
    return overrides
