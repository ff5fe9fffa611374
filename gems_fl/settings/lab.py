"""The ``lab`` setting: the research switches of the paper's studies, in one run setting.

The app's ``[tool.flwr.app.config]`` holds the product's settings only; the switches the
studies turn (the fine-tuning recipe, the paper's radius-search and neuron constants, the
Gram point and its ridges, ...) are declared with ``lab=True`` and reach a run inside one
text setting, which Flower passes through like any other::

    flwr run . --run-config "lab='tune-curve=100,200 tune-stop=fixed profile=paper'"

Inside it, ``key=value`` pairs separated by spaces; a value is read as TOML (a number,
``true``/``false``, quoted text), else as bare text. In-process callers (the reproduction,
``GEMSClassifier``, tests) may also give a switch directly as its own key.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Collection, Mapping
from typing import Any

from gems_fl.settings.checks import SettingsError

__all__ = ["LAB_KEY", "expand_lab", "parse_pairs"]

LAB_KEY = "lab"
PAIR = re.compile(r"""(\S+?)=('[^']*'|"[^"]*"|\S+)""")


def parse_pairs(text: str, *, where: str, bare_text: bool) -> dict[str, Any]:
    """``key=value`` pairs separated by spaces, each value read as TOML.

    ``bare_text``: a value TOML cannot read is text (``tune-stop=fixed``); else a
    ``ValueError`` shows the quoted form, as ``flwr run`` would want it. ``where`` names
    the source in errors (``--run-config``, ``lab``).
    """
    result: dict[str, Any] = {}
    if not text.strip():
        return result
    rest = PAIR.sub(" ", text).strip()
    if rest:
        raise ValueError(f"{where}: {rest.split()[0]!r} is not key=value; write e.g. "
                         + ("lab='tune-curve=100,200 tune-stop=fixed'" if bare_text
                            else "--run-config \"eps=0.5 dataset='fashion-mnist'\""))
    for key, value in PAIR.findall(text):
        try:
            parsed = tomllib.loads(f"value = {value}")["value"]
        except tomllib.TOMLDecodeError:
            bare = value.strip("'\"")
            if not bare_text:
                raise ValueError(
                    f"{where}: {key}={value} is not a number, true/false or a quoted string; "
                    f"quote text values: {where} \"{key}='{bare}'\"") from None
            parsed = bare
        result[key] = parsed
    return result


def expand_lab(config: Mapping[str, Any], lab_keys: Collection[str],
               product_keys: Collection[str]) -> dict[str, Any]:
    """``config`` with its ``lab`` text replaced by the switches it names.

    A ``SettingsError`` names a key the text holds that is a product setting (set it
    directly), is no setting at all (with the closest switches), or is also given
    directly with another value.
    """
    out = {k: v for k, v in config.items() if k != LAB_KEY}
    text = config.get(LAB_KEY, "")
    if not isinstance(text, str):
        raise SettingsError(f"lab={text!r} must be text: 'key=value key=value', e.g. "
                            "lab='tune-curve=100,200'")
    try:
        switches = parse_pairs(text, where="lab", bare_text=True)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    for key, value in switches.items():
        if key in product_keys:
            raise SettingsError(f"lab: {key!r} is a product setting, not a research switch; "
                                f"set it on its own: --run-config \"{key}=...\"")
        if key not in lab_keys:
            close = difflib.get_close_matches(key, sorted(lab_keys), n=3, cutoff=0.6)
            raise SettingsError(
                f"lab: {key!r} is not a research switch"
                + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else "")
                + "; docs/settings.md lists them under 'Research switches'")
        if key in out and out[key] != value:
            raise SettingsError(f"lab: {key} is given twice ({out[key]!r} and, in lab, "
                                f"{value!r}); give it once")
        out[key] = value
    return out
