"""The ``lab`` setting: the research switches of the paper's studies, in one run setting.

The app's ``[tool.flwr.app.config]`` holds the product's settings only; the switches the
studies turn (the fine-tuning recipe, the paper's radius-search and neuron constants, the
Gram point and its ridges, ...) are declared with ``lab=True`` and reach a run inside one
text setting, which Flower passes through like any other::

    flwr run . --run-config "lab='tune-curve=100,200 tune-stop=fixed profile=paper'"

Inside it, ``key=value`` pairs separated by spaces; each value is read as its switch's
type (a number, ``true``/``false``, text with quotes optional). In-process callers (the reproduction,
``GEMSClassifier``, tests) may also give a switch directly as its own key.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Collection, Mapping
from typing import Any

from gems_fl.settings.checks import SettingsError

__all__ = ["LAB_KEY", "expand_lab", "fold_lab", "parse_pairs"]

LAB_KEY = "lab"
PAIR = re.compile(r"""(\S+?)=('[^']*'|"[^"]*"|\S+)""")


def parse_pairs(text: str, *, where: str) -> dict[str, Any]:
    """``key=value`` pairs separated by spaces, each value read as TOML, as ``flwr run``
    reads ``--run-config``; a ``ValueError`` shows the quoted form of a value TOML cannot
    read. ``where`` names the source in errors."""
    result: dict[str, Any] = {}
    if not text.strip():
        return result
    rest = PAIR.sub(" ", text).strip()
    if rest:
        raise ValueError(f"{where}: {rest.split()[0]!r} is not key=value; write e.g. "
                         f"{where} \"eps=0.5 dataset='fashion-mnist'\"")
    for key, value in PAIR.findall(text):
        try:
            result[key] = tomllib.loads(f"value = {value}")["value"]
        except tomllib.TOMLDecodeError:
            bare = value.strip("'\"")
            raise ValueError(
                f"{where}: {key}={value} is not a number, true/false or a quoted string; "
                f"quote text values: {where} \"{key}='{bare}'\"") from None
    return result


def expand_lab(config: Mapping[str, Any], lab_defaults: Mapping[str, Any],
               product_keys: Collection[str]) -> dict[str, Any]:
    """``config`` with its ``lab`` text replaced by the switches it names, each value read
    as its switch's type (``lab_defaults``: each switch's default): ``class-grams=true``
    is the text ``true`` for a text switch, the truth value for a boolean one.

    A ``SettingsError`` names a key the text holds that is a product setting (set it
    directly), is no setting at all (with the closest switches), has a value its type
    cannot take, or is also given directly with another value.
    """
    out = {k: v for k, v in config.items() if k != LAB_KEY}
    text = config.get(LAB_KEY, "")
    if not isinstance(text, str):
        raise SettingsError(f"lab={text!r} must be text: 'key=value key=value', e.g. "
                            "lab='tune-curve=100,200'")
    if text.strip() and PAIR.sub(" ", text).strip():
        raise SettingsError(f"lab: {PAIR.sub(' ', text).split()[0]!r} is not key=value; write "
                            "e.g. lab='tune-curve=100,200 tune-stop=fixed'")
    for key, raw in PAIR.findall(text):
        if key in product_keys:
            raise SettingsError(f"lab: {key!r} is a product setting, not a research switch; "
                                f"set it on its own: --run-config \"{key}=...\"")
        if key not in lab_defaults:
            close = difflib.get_close_matches(key, sorted(lab_defaults), n=3, cutoff=0.6)
            raise SettingsError(
                f"lab: {key!r} is not a research switch"
                + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else "")
                + "; docs/settings.md lists them under 'Research switches'")
        value = _typed(key, raw, lab_defaults[key])
        if key in out and out[key] != value:
            raise SettingsError(f"lab: {key} is given twice ({out[key]!r} and, in lab, "
                                f"{value!r}); give it once")
        out[key] = value
    return out


def _typed(key: str, raw: str, default: Any) -> Any:
    """A ``lab`` value's text as its switch's type (quotes optional around text)."""
    text = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise SettingsError(f"lab: {key}={raw} is not {type(default).__name__} like its default "
                            f"{default!r}") from None
    return text


def fold_lab(config: Mapping[str, Any], lab_keys: Collection[str]) -> dict[str, Any]:
    """``config`` with its research switches moved into the ``lab`` text (after any it
    holds): the run config Flower accepts for the app, for code that builds one from a
    dict (a deployment's ``flwr run``). :func:`expand_lab` reads it back."""
    switches = {k: v for k, v in config.items() if k in lab_keys}
    if not switches:
        return dict(config)
    out = {k: v for k, v in config.items() if k not in lab_keys}
    pairs = " ".join(f"{key}={_lab_value(value)}" for key, value in switches.items())
    out[LAB_KEY] = f"{out.get(LAB_KEY, '')} {pairs}".strip()
    return out


def _lab_value(value: Any) -> str:
    """A switch's value as ``lab`` text that :func:`expand_lab` reads back unchanged: bare,
    else in the quotes it does not hold (``_typed`` strips them; nothing is escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if text and not any(c in text for c in " \t'\"="):
        return text
    for quote in "\"'":
        if quote not in text:
            return f"{quote}{text}{quote}"
    raise ValueError(f"{value!r} holds both quote marks: it cannot travel in the lab text")
