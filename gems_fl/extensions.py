"""Where the lab (the ``gems_lab`` package: the paper's studies) plugs into the product.

The product never imports the lab (a house-rule test checks it). It finds what the lab
offers through two entry-point groups that the lab declares in ``pyproject.toml``:

- ``gems_fl.commands``: extra ``gems-fl`` subcommands (the lab's ``reproduce``), each a
  :class:`Command`;
- ``gems_fl.studies``: studies the ServerApp runs after its results rows when a run's
  settings ask for one (the fine-tuning curve, ``tune-curve``), each a callable that takes
  the run's :class:`StudyInputs` and returns the study's JSON-able record.

A product installed without the lab runs unchanged; a run that asks for a study it does
not have stops at the study with a message naming what to install.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import argparse

    import numpy as np
    from torch import nn

COMMANDS_GROUP = "gems_fl.commands"
STUDIES_GROUP = "gems_fl.studies"

__all__ = ["COMMANDS_GROUP", "STUDIES_GROUP", "Command", "StudyInputs", "commands", "study"]


class Command(Protocol):
    """A ``gems-fl`` subcommand another package adds."""

    name: str

    def add_parser(self, subparsers: argparse._SubParsersAction) -> None:
        """Add the subcommand's parser (named :attr:`name`) to ``gems-fl``'s."""

    def run(self, args: argparse.Namespace, argv: list[str] | None) -> int:
        """Run it on the parsed ``args``; the exit status."""


@dataclass(frozen=True)
class StudyInputs:
    """What a server-side study gets: the run's models, the server's data and the run's
    settings as a run config (the study reads what it needs of them)."""

    gems_model: nn.Module
    local_models: list[nn.Module]
    averaged_model: nn.Module | None
    fresh_model: Callable[[], nn.Module]  # a new model of the run's architecture
    pool: tuple[np.ndarray, np.ndarray]  # the server's public pool (rows, labels)
    test: tuple[np.ndarray, np.ndarray]
    run_config: dict[str, Any]  # the run's settings, ``{key: value}`` (Settings.to_config)


def _entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def commands() -> list[Command]:
    """Every installed extra subcommand, by name."""
    return [ep.load() for _, ep in sorted(_entry_points(COMMANDS_GROUP).items())]


def study(name: str) -> Callable[[StudyInputs], dict[str, Any]]:
    """The installed study ``name``; a ``LookupError`` that says what to install when the
    lab is not installed with this package."""
    found = _entry_points(STUDIES_GROUP)
    if name not in found:
        raise LookupError(
            f"the {name!r} study is not installed (installed: {sorted(found) or 'none'}); it "
            "is part of the gems_lab package: install gems-fl from its source checkout "
            "(`python3 -m pip install -e .`), or leave the study's setting empty")
    return found[name].load()
