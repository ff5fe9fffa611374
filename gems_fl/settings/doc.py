"""The run settings in words, generated from their declarations in :mod:`gems_fl.settings`:
the README's "Settings" table (``python -m gems_fl.settings.doc`` prints it; a test checks
README.md holds it verbatim) and each setting's meaning for ``gems-fl run --help``."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gems_fl.settings.checks import key_of
from gems_fl.settings import Settings


def settings_table() -> list[tuple[tuple[str, ...], tuple[Any, ...], str]]:
    """The README "Settings" table: ``(keys, defaults, meaning)`` per row, in declaration
    order; neighbouring settings with the same meaning share a row."""
    rows: list[tuple[tuple[str, ...], tuple[Any, ...], str]] = []
    for f in fields(Settings):
        meaning = f.metadata["meaning"]
        if rows and rows[-1][2] == meaning:
            keys, defaults, _ = rows[-1]
            rows[-1] = ((*keys, key_of(f)), (*defaults, f.default), meaning)
        else:
            rows.append(((key_of(f),), (f.default,), meaning))
    return rows


def format_default(value: Any) -> str:
    """A default as the README table shows it (TOML spelling, ``""`` for empty text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value).replace("e-0", "e-")


def settings_markdown() -> str:
    """The README's "Settings" table, generated (``python -m gems_fl.settings``)."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for keys, defaults, text in settings_table():
        lines.append(f"| {', '.join(f'`{k}`' for k in keys)} | "
                     f"{', '.join(f'`{format_default(d)}`' for d in defaults)} | {text} |")
    return "\n".join(lines)


def meaning(key: str) -> str:
    """The README meaning of one setting (``KeyError`` if there is no such setting)."""
    for f in fields(Settings):
        if key_of(f) == key:
            return f.metadata["meaning"]
    raise KeyError(key)


if __name__ == "__main__":
    print(settings_markdown())
