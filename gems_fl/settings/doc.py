"""The run settings in words, generated from their declarations in :mod:`gems_fl.settings`:
the README's table of the user's settings, the full reference ``docs/settings.md``
(``python -m gems_fl.settings.doc [--reference]`` prints either; a test checks both files
hold them verbatim) and each setting's meaning for ``gems-fl run --help``."""

from __future__ import annotations

import sys
from dataclasses import fields
from typing import Any

from gems_fl.settings import Settings, lab_keys
from gems_fl.settings.checks import key_of

__all__ = ["format_default", "meaning", "reference_markdown", "settings_markdown",
           "settings_table", "user_keys"]

REFERENCE_INTRO = """# Settings reference

Every run setting, generated from its declaration under `gems_fl/settings/`
(`python -m gems_fl.settings.doc --reference` prints this page; a test checks it). The
README's table lists the user's choices; then the product's internals, each settable
with `--run-config "key=value"`; then the research switches of the paper's studies (the
fine-tuning recipe, the paper's search and neuron constants, the Gram points and their
ridges, `profile='paper'`), which are not in the app's `pyproject.toml` and reach a run
inside the one `lab` setting:

```bash
gems-fl run --nodes 5 --run-config "lab='tune-curve=100,200 tune-stop=fixed profile=paper'"
```

Inside `lab`, `key=value` pairs separated by spaces; a value is a number, `true`/`false`
or text (quotes optional). A product setting or an unknown key there is refused, naming it.
"""


def settings_table(user_only: bool = False) -> list[tuple[tuple[str, ...], tuple[Any, ...], str]]:
    """The settings table: ``(keys, defaults, meaning)`` per row, in declaration order;
    neighbouring settings with the same meaning share a row. ``user_only``: the user's
    settings (the README's table); else every setting, with its detail."""
    rows: list[tuple[tuple[str, ...], tuple[Any, ...], str]] = []
    group = None
    for f in fields(Settings):
        if user_only and not f.metadata["user"]:
            continue
        text = f.metadata["meaning"]
        if not user_only and f.metadata["detail"]:
            text = f"{text}. {f.metadata['detail']}"
        same_group = group == (group := (f.metadata["user"], f.metadata["lab"]))
        if rows and rows[-1][2] == text and same_group:
            keys, defaults, _ = rows[-1]
            rows[-1] = ((*keys, key_of(f)), (*defaults, f.default), text)
        else:
            rows.append(((key_of(f),), (f.default,), text))
    return rows


def format_default(value: Any) -> str:
    """A default as the tables show it (TOML spelling, ``""`` for empty text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value).replace("e-0", "e-")


def _markdown(rows: list[tuple[tuple[str, ...], tuple[Any, ...], str]]) -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for keys, defaults, text in rows:
        lines.append(f"| {', '.join(f'`{k}`' for k in keys)} | "
                     f"{', '.join(f'`{format_default(d)}`' for d in defaults)} | {text} |")
    return "\n".join(lines)


def settings_markdown() -> str:
    """The README's table of the user's settings."""
    return _markdown(settings_table(user_only=True))


def reference_markdown() -> str:
    """``docs/settings.md``: every setting, user's first, with its detail."""
    user, lab = set(user_keys()), set(lab_keys())
    rows = settings_table()
    first = [r for r in rows if r[0][0] in user]
    rest = [r for r in rows if r[0][0] not in user | lab]
    switches = [r for r in rows if r[0][0] in lab]
    return (f"{REFERENCE_INTRO}\n## The user's settings\n\n{_markdown(first)}\n\n"
            f"## Internals\n\n{_markdown(rest)}\n\n"
            f"## Research switches (inside `lab`)\n\n{_markdown(switches)}\n")


def user_keys() -> tuple[str, ...]:
    """The keys of the user's settings, in declaration order."""
    return tuple(key_of(f) for f in fields(Settings) if f.metadata["user"])


def meaning(key: str) -> str:
    """The meaning of one setting (``KeyError`` if there is no such setting)."""
    for f in fields(Settings):
        if key_of(f) == key:
            return f.metadata["meaning"]
    raise KeyError(key)


if __name__ == "__main__":
    print(reference_markdown() if "--reference" in sys.argv[1:] else settings_markdown())
