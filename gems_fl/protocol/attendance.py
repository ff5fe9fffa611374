"""Which sites took part to the end, which were left out and why, and whether the run has
the sites it requires (``required-nodes``).

A site can be left out at the identity round (its data does not fit the run, or it did not
answer), in a round of the protocol (no reply, a malformed reply), or in the evaluate round
(it did not answer). :func:`attendance` gathers them into one report whose ``line`` is the
run's last word on its nodes, e.g. ``completed with 3 of 4 sites; left out: site-29f (node
'site-29f' holds data with 29 features; the run has 30 ...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

REASON_CHARS = 160  # a left-out site's reason in the one-line statement (results keep it whole)


@dataclass
class Attendance:
    """The sites present at the identity round, those that took part to the end, and the
    ones left out (``{name: (stage, reason)}``)."""

    present: list[str]
    completed: list[str]
    left_out: dict[str, tuple[str, str]] = field(default_factory=dict)
    required: str = "all"  # required-nodes as given
    wanted: int | tuple[str, ...] | None = None  # ... parsed: None every site, a count, names
    missing_required: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every required site took part to the end."""
        return not self.missing_required

    @property
    def line(self) -> str:
        """One line: how many sites completed, who was left out and why, what is missing."""
        text = f"completed with {len(self.completed)} of {len(self.present)} sites"
        if self.left_out:
            text += "; left out: " + _grouped(
                [(name, reason) for name, (_, reason) in sorted(self.left_out.items())])
        if self.missing_required:
            text += (f"; required-nodes={self.required!r} is not met: "
                     + _missing_text(self.wanted, self.missing_required, len(self.completed)))
        return text

    @property
    def roll(self) -> str:
        """The sites the run expected and those it heard from at the identity round, e.g.
        ``expected 4 site(s) (required-nodes='4'); heard from 3 site(s) (site-a, site-b,
        site-c)``."""
        return (f"expected {_expected(self.wanted)} (required-nodes={self.required!r}); heard "
                f"from {len(self.present)} site(s) ({_listed(self.present)})")

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "roll": self.roll, "ok": self.ok, "required": self.required,
                "present": self.present, "completed": self.completed,
                "left_out": [{"name": n, "stage": s, "reason": r}
                             for n, (s, r) in sorted(self.left_out.items())],
                "missing_required": self.missing_required}


def _expected(wanted: int | tuple[str, ...] | None) -> str:
    return ("every site present" if wanted is None else
            f"{wanted} site(s)" if isinstance(wanted, int) else ", ".join(wanted))


def _listed(names: list[str], most: int = 10) -> str:
    shown = ", ".join(names[:most]) or "none"
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _short(reason: str) -> str:
    reason = re.sub(r"client error \d+: ", "", " ".join(str(reason).split()))
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 3] + "..."


def _grouped(sites: list[tuple[str, str]]) -> str:
    """``a, b (why); c (other why)``: sites left out for the same reason named together."""
    by_reason: dict[str, list[str]] = {}
    for name, why in sites:
        by_reason.setdefault(_short(why), []).append(name)
    return "; ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items())


def _missing_text(wanted: int | tuple[str, ...] | None, missing: list[str],
                  completed: int) -> str:
    if isinstance(wanted, int):
        return f"{completed} site(s) took part, {wanted} required"
    return "missing " + ", ".join(missing)


def _label(entry: dict[str, object]) -> str:
    return str(entry.get("node_name") or f"node {entry['node_id']}")


def attendance(present: dict[int, str], identity_rejected: list[dict[str, object]],
               round_rejected: list[dict[str, object]], evaluate_missing: list[dict[str, object]],
               required: str, wanted: int | tuple[str, ...] | None) -> Attendance:
    """The run's :class:`Attendance`.

    ``present``: ``{node id: name}`` of every node connected at the identity round (the
    name a node reported, else ``node <id>``); the three lists: rejection entries
    (``node_id``, ``node_name``, ``reason``) of the identity round, the protocol's rounds
    and the evaluate round. A node is counted once, at the first stage that left it out.
    ``required``: the ``required-nodes`` setting's text; ``wanted``: it parsed (None: every
    site present at the identity round; a count; or the names that must take part).
    """
    left_out: dict[str, tuple[str, str]] = {}
    seen: set[int] = set()
    for stage, entries in (("identity", identity_rejected), ("rounds", round_rejected),
                           ("evaluate", evaluate_missing)):
        for entry in entries:
            node_id = int(entry["node_id"])
            if node_id in seen:
                continue
            seen.add(node_id)
            name = present.get(node_id) or _label(entry)
            left_out[name] = (stage, str(entry.get("reason", "")))
    names = [present.get(n) or f"node {n}" for n in sorted(present)]
    completed = sorted(present.get(n) or f"node {n}" for n in present if n not in seen)
    if wanted is None:
        missing = sorted(left_out)
    elif isinstance(wanted, int):
        missing = sorted(left_out) if len(completed) < wanted else []
    else:
        missing = [name for name in wanted if name not in completed]
    return Attendance(sorted(names), completed, left_out, required, wanted, missing)


def missing_before_training(present: dict[int, str], participants: list[int],
                            names: dict[int, str], identity_rejected: list[dict[str, object]],
                            wanted: int | tuple[str, ...] | None, waited_s: float
                            ) -> list[tuple[str, str]]:
    """The required sites the identity round lacks, ``[(site, why)]``, empty when it has
    them all: with ``wanted`` None (``required-nodes='all'``) every node present must fit
    the run; with a count, that many must; with names, each named site must have
    connected and fit (``why``: ``not connected after N s`` or ``rejected: <reason>``)."""
    rejected = {str(r.get("node_name") or present.get(int(r["node_id"]))
                    or f"node {r['node_id']}"): str(r.get("reason", ""))
                for r in identity_rejected}
    taking_part = {names[n] for n in participants}
    if wanted is None:
        return [(name, f"rejected: {why}") for name, why in sorted(rejected.items())]
    if isinstance(wanted, int):
        if len(taking_part) >= wanted:
            return []
        short = [(name, f"rejected: {why}") for name, why in sorted(rejected.items())]
        lacking = wanted - len(taking_part) - len(short)
        if lacking > 0:
            short.append((f"{lacking} more site(s)", f"not connected after {waited_s:.0f} s"))
        return short
    return [(name, f"rejected: {rejected[name]}" if name in rejected
             else f"not connected after {waited_s:.0f} s")
            for name in wanted if name not in taking_part]


def expected_line(required: str, wanted: int | tuple[str, ...] | None, heard_from: list[str],
                  missing: list[tuple[str, str]]) -> str:
    """The one line of a run stopped before training: the sites it expected (``required``:
    the ``required-nodes`` text, ``wanted`` it parsed), those it heard from, and each
    required one missing with why."""
    return (f"stopped before training: expected {_expected(wanted)} (required-nodes={required!r}); "
            f"heard from "
            f"{len(heard_from)} site(s) ({', '.join(heard_from) or 'none'}); missing: "
            + _grouped(missing))


class RunStopped(RuntimeError):
    """A run that ended without the model it was asked for, with what it ended with:
    ``results`` (what ``results.json`` holds) and ``model_state`` (``h_G``'s arrays, None
    where nothing was trained); both None where the exception was raised without them."""

    def __init__(self, message: str, results: dict[str, Any] | None = None,
                 model_state: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.results = results
        self.model_state = model_state


class RequiredNodesMissing(RunStopped):
    """A site that ``required-nodes`` names (or counts) did not take part to the end; the
    results say so with status ``incomplete``."""


class ModelNotGoodEnough(RunStopped):
    """``h_G`` was good enough on fewer sites than ``min-good-enough`` asks; the results
    say so with status ``not-good-enough``."""
