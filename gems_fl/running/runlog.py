"""The streamed log of a run: what to show, the phases it reports, and its errors.

``flwr run --stream`` forwards what the ServerApp and the simulated ClientApps log.
:class:`RunLog` keeps all of it in a file, shows it without the SuperLink's HTTP
access lines, drives a progress display from the lines the ServerApp already prints,
and at the end reduces hundreds of traceback lines to the distinct error messages
(:func:`summarise_errors`): each once, with the nodes (or the server) that had it.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gems_fl.evaluation.results_bundle import BundleReader

STARTED = re.compile(r"Successfully started run (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ACCESS_LINE = re.compile(r'\[uvicorn\.access\]|"(GET|POST|PUT|DELETE|HEAD) /\S* HTTP/[\d.]+" \d{3}')
LEVEL = re.compile(r"^(INFO|WARNING|ERROR|DEBUG|CRITICAL)\s*:\s?\s*(.*)$")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?:\([^)]*\))?: (.+)$")
REJECTED = re.compile(r"(?:(Identify|Round \d+|Layer \d+|Output layer): )?"
                      r"Rejected reply from node (\d+)(?: \('([^']*)'\))?: (.*)$")
NO_REPLY = re.compile(r"(?:(Identify|Round \d+): )?No reply from node (\d+)(?: \('([^']*)'\))?")
FLOWER_SUMMARY_LINE = re.compile(r"^INFO\s*:\s*\t")  # the dump's lines start with a tab
RAISED_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?:\([^)]*\))?: (.*)$")  # any exception's name
CLIENT_MESSAGE = re.compile(r"Message: (.*?)(?:'>)?$")
SERVER_FAILED = ("Simulation raised an exception", "ServerApp raised an exception",
                 "Exception in ServerApp", "ServerApp thread raised an exception")
# Flower's notes for its own CLI users that mislead a gems-fl run user (the node count
# comes from --nodes): kept in the log file, not shown; one line says so instead.
FLOWER_NOTES = ("default simulated SuperNodes changed from 10 to 2",
                "To change federation size, use the following command",
                "flwr federation simulation-config")
FLOWER_NOTES_LOGGED = ("gems-fl: Flower's notes on its default federation size and `flwr "
                       "federation simulation-config` left out: this run's size is gems-fl "
                       "run's --nodes")
# `flwr run`'s note that it installed the app bundle into the private Flower home
FLOWER_INSTALL_LINE = re.compile(r"^Successfully installed \S+ to ")
# The ServerApp raises these on purpose after it wrote its results and logged the reason
# (a required site missing, h_G good enough on too few sites): Flower logs the raise as a
# crash; the display keeps only the ServerApp's own line, the log file everything.
DELIBERATE_STOPS = ("RequiredNodesMissing", "ModelNotGoodEnough")
CRASH_NOTES = ("Exit Code:", "An unhandled exception occurred", "For more information, visit")
NOISE = ("Traceback (most recent call last)", "Exit Code:", "An exception was raised when processing",
         "For more information, visit")
# After the results are written, Flower's Ray backend shuts down: it asks every actor to
# exit (``actor.terminate.remote()``, which calls ``ray.actor.exit_actor()``) and calls
# ``ray.shutdown()`` at once, without waiting. An actor still exiting when the driver goes
# can abort in Ray's C++ core; Ray forwards its crash dump ("Fatal Python error: Aborted",
# the threads' stacks) prefixed with the worker, e.g. ``(ClientAppActor pid=123)``. The run
# is over by then, so those lines stay in the log file and one line says so.
RESULTS_WRITTEN = re.compile(r"Results written to ")
RAY_WORKER_LINE = re.compile(r"^\((?:[\w.]+ )?pid=\d+[^)]*\)|^\(raylet\)|Fatal Python error|"
                             r"terminate called|SIGABRT|^\*\*\* |Manually terminating ClientAppActor")
# of those, the lines of a real crash dump (not Flower's own "Manually terminating" notice)
RAY_CRASH_LINE = re.compile(r"Fatal Python error|terminate called|SIGABRT|^\*\*\* |"
                            r"Segmentation fault|core dumped")
RAY_SHUTDOWN_NOTE = ("gems-fl: a Ray worker crashed while Flower shut the simulation down, "
                     "after the results were written; the results are complete (the worker's "
                     "report is in the log file)")


def plain(line: str) -> str:
    """``line`` without ANSI colours and trailing whitespace."""
    return ANSI.sub("", line).rstrip()


def is_info_line(line: str) -> bool:
    """A log record at INFO level (Flower's and the ServerApp's round-by-round log),
    with the continuation lines Flower indents under it."""
    return plain(line).startswith("INFO ")


def is_access_line(line: str) -> bool:
    """A SuperLink HTTP access-log line (never shown)."""
    return bool(ACCESS_LINE.search(line))


# (pattern, phase template); groups fill the template.
PHASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Successfully started run (\d+)"), "run {0} started"),
    (re.compile(r"Federation .*\((\d+) simulated SuperNodes\)"), "identity check: waiting for {0} nodes"),
    (re.compile(r"Identify: Replies from (\d+) of (\d+) nodes"), "identity check: {0} of {1} nodes replied"),
    (re.compile(r"Loading (\S+) on the server"), "loading {0} on the server"),
    (re.compile(r"\[ROUND (\d+)/(\d+)\]"), "round {0}/{1}: waiting for replies"),
    (re.compile(r"^Round (\d+): Replies from (\d+) of (\d+) nodes"), "round {0}: {1} of {2} nodes replied"),
    (re.compile(r"^(?:Evaluating|Retraining each node)"), "baselines: evaluating on the test set"),
    (re.compile(r"Results written to (\S+)"), "results written to {0}"),
]


@dataclass
class Progress:
    """Phases of a run read from its log lines; a rich live line on a terminal."""

    stream: IO[str] = field(default_factory=lambda: sys.stdout)
    live: bool | None = None
    phase: str = "starting the SuperLink"
    started: float = field(default_factory=time.monotonic)
    phase_started: float = field(default_factory=time.monotonic)
    rounds: int | None = None
    history: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.live is None:
            self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._live = None
        self._console = None
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.stream)
            self._live = Live(self._render(), console=self._console, transient=True,
                              refresh_per_second=4, get_renderable=self._render)
            self._live.start()

    def _render(self):
        from rich.spinner import Spinner

        now = time.monotonic()
        text = f"{self.phase}  [{now - self.phase_started:5.1f} s, total {now - self.started:5.1f} s]"
        # One spinner for the whole run: a new one each refresh would restart at its
        # first frame and never turn.
        if getattr(self, "_spinner", None) is None:
            self._spinner = Spinner("dots", text)
        else:
            self._spinner.update(text=text)
        return self._spinner

    def echo(self, line: str) -> None:
        """Show one log line (above the live line on a terminal)."""
        if self._console is not None:
            from rich.text import Text

            self._console.print(Text.from_ansi(line.rstrip("\n")), soft_wrap=True)
        else:  # not a terminal: no colour codes (Flower's and Ray's) in a piped log
            text = ANSI.sub("", line)
            self.stream.write(text if text.endswith("\n") else text + "\n")
            self.stream.flush()

    def feed(self, line: str) -> None:
        """Update the phase from one (plain) log line."""
        text = LEVEL.sub(r"\2", plain(line)).strip()
        for pattern, template in PHASES:
            match = pattern.search(text)
            if match:
                groups = match.groups()
                if pattern.pattern.startswith(r"\[ROUND"):
                    self.rounds = int(groups[1])
                phase = template.format(*groups)
                if phase.startswith("round ") and "replied" in phase and self.rounds:
                    phase = phase.replace(":", f"/{self.rounds}:", 1)
                self.set(phase)
                return

    def set(self, phase: str) -> None:
        """Enter a new phase; print it as a plain line."""
        now = time.monotonic()
        self.history.append((self.phase, now - self.phase_started))
        self.phase, self.phase_started = phase, now
        self.echo(f"gems-fl ▸ [{now - self.started:6.1f} s] {phase}")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


@dataclass
class ErrorSummary:
    """One distinct error: where it happened and its message."""

    message: str
    server: bool = False
    nodes: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.server:
            return f"  server: {self.message}"
        names = ", ".join(self.nodes[:4]) + (", ..." if len(self.nodes) > 4 else "")
        count = len(self.nodes)
        return f"  {count} node{'s' if count != 1 else ''} ({names}): {self.message}"


def _blocks(lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """Split plain log lines into (level, first text, continuation lines) blocks."""
    blocks: list[tuple[str, str, list[str]]] = []
    for line in lines:
        match = LEVEL.match(line)
        if match:
            blocks.append((match.group(1), match.group(2).strip(), []))
        elif blocks:
            blocks[-1][2].append(line)
        else:
            blocks.append(("", line, []))
    return blocks


def _node_message(reason: str, rest: list[str]) -> str:
    for text in reversed([reason, *rest]):
        match = CLIENT_MESSAGE.search(text)
        if match and match.group(1).strip():
            return match.group(1).strip()
    for text in reversed(rest):
        match = EXCEPTION_LINE.match(text)
        if match:
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}"
    return re.sub(r"^client error \d+: ", "", reason)


CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def _raised(lines: list[str]) -> re.Match[str] | None:
    """The exception line of a logged traceback (the last of a chain).

    Tracebacks quoted inside an exception's message (a node's error the server
    repeats) come after the exception line without a chaining sentence; they are
    not the server's own.
    """
    found = None
    state = "text"  # text -> frames (after "Traceback") -> raised -> (chained) text
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            if state in ("text", "frames"):
                state = "frames"
        elif state == "frames" and line and not line[0].isspace():
            match = EXCEPTION_LINE.match(line)
            if match:
                found, state = match, "raised"
        elif state == "raised" and any(line.startswith(c) for c in CHAINED):
            state = "text"
    return found


def summarise_errors(lines: list[str], limit: int = 400) -> list[ErrorSummary]:  # noqa: C901
    """The distinct errors of a failed run's log: the server's, then the nodes'.

    A node's error is the innermost message of its rejected reply (the exception the
    ClientApp raised), counted once per node; the server's is the last exception line
    of the traceback the simulation logged. Without either, distinct ERROR lines.
    """
    clean = [plain(line) for line in lines if not is_access_line(line)]
    node_errors: dict[str, ErrorSummary] = {}
    server: list[ErrorSummary] = []
    fallback: dict[str, ErrorSummary] = {}
    for level, text, rest in _blocks(clean):
        rejected = REJECTED.search(text) if level == "WARNING" else None
        missing = NO_REPLY.search(text) if level == "WARNING" else None
        if rejected or missing:
            match = rejected or missing
            node = match.group(3) or match.group(2)
            message = _node_message(match.group(4), rest) if rejected else "no reply (timed out or lost)"
            entry = node_errors.setdefault(message, ErrorSummary(message))
            if node not in entry.nodes:
                entry.nodes.append(node)
        elif level == "ERROR" and any(s in text for s in SERVER_FAILED):
            final = _raised(rest)
            if final:
                name, message = final.group(1).rsplit(".", 1)[-1], final.group(2)
                server.append(ErrorSummary(f"{name}: {message}", server=True))
        elif level in ("ERROR", "CRITICAL") and text and not any(s in text for s in NOISE):
            fallback.setdefault(text, ErrorSummary(text, server=True))
    found = server + list(node_errors.values())
    if not found:
        found = list(fallback.values())
    for entry in found:
        if node_errors and entry.server and " Rejected: " in entry.message:
            entry.message = entry.message.split(" Rejected: ")[0] + " (rejections below)"
        if len(entry.message) > limit:
            entry.message = entry.message[:limit] + " ..."
    return found


class RunLog:
    """Tee of the streamed run output: full file, filtered display, progress phases."""

    def __init__(self, path: Path, progress: Progress | None, *, verbose: bool = False) -> None:
        self.path = path
        self.verbose = verbose  # show INFO lines too (the file always has them)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("w", encoding="utf-8", errors="replace")
        self.progress = progress
        self.lines: list[str] = []
        self.run_id: int | None = None
        self.bundle = BundleReader()  # results sent home in the log: kept, never shown
        self._noted_in_file = False
        self._held: list[str] = []  # a crash report being read, shown unless deliberate
        self._after_stop = False
        self._flower_summary = False  # inside Flower's "Final results:" dump
        self._results_written = False  # the ServerApp logged where its results are
        self._shutdown_noted = False

    def add(self, line: str) -> None:  # noqa: C901
        if self.run_id is None:
            match = STARTED.search(line)
            if match:
                self.run_id = int(match.group(1))
        if self.bundle.feed(line):
            return
        if any(note in line for note in FLOWER_NOTES):  # not this run's concern: one line
            if not self._noted_in_file:
                self._noted_in_file = True
                self.file.write(FLOWER_NOTES_LOGGED + "\n")
            return
        self.file.write(ANSI.sub("", line))
        self.file.flush()
        self.lines.append(line)
        if is_access_line(line):
            return
        if not self.verbose and FLOWER_INSTALL_LINE.search(line):
            return
        if self._in_flower_summary(line):
            return
        if self._after_results(line):
            return
        for shown in self._hold_crash_reports(line):
            self._show(shown)

    def _in_flower_summary(self, line: str) -> bool:
        """Whether ``line`` belongs to the "Final results:" dump of Flower's strategy (its
        arrays' size and metric dictionaries, empty ones included): gems-fl prints its own
        table, so the dump stays in the log file only."""
        text = plain(line)
        body = LEVEL.sub(r"\2", text).strip()
        if body == "Final results:":
            self._flower_summary = True
            return True
        if self._flower_summary:
            if not body or FLOWER_SUMMARY_LINE.match(text):
                return True
            self._flower_summary = False
        return False

    def _after_results(self, line: str) -> bool:
        """Whether ``line`` is a Ray worker's output after the results were written (see
        :data:`RAY_WORKER_LINE`): kept in the file, replaced on screen by one note."""
        text = plain(line)
        if RESULTS_WRITTEN.search(text):
            self._results_written = True
            return False
        if not self._results_written or not RAY_WORKER_LINE.search(text):
            return False
        if not self._shutdown_noted and RAY_CRASH_LINE.search(text):
            self._shutdown_noted = True
            self._show(RAY_SHUTDOWN_NOTE + "\n")
        return True

    def _hold_crash_reports(self, line: str) -> list[str]:
        """The lines to show now: a crash report (Flower's ERROR line, the traceback) is
        held until its exception line; it is dropped, with Flower's exit notes after it,
        when the exception is one of the ServerApp's deliberate stops."""
        text = plain(line)
        body = LEVEL.sub(r"\2", text).strip()
        if self._after_stop and (not body or body.startswith(CRASH_NOTES)):
            return []
        self._after_stop = False
        if not self._held:
            if body.startswith(SERVER_FAILED) or text.startswith("Traceback (most recent"):
                self._held.append(line)
                return []
            return [line]
        self._held.append(line)
        if LEVEL.match(text) or len(self._held) > 1000:  # a new record: not one report
            held, self._held = self._held, []
            return held
        raised = RAISED_LINE.match(text)
        if raised is None:
            return []
        held, self._held = self._held, []
        if raised.group(1).rsplit(".", 1)[-1] in DELIBERATE_STOPS:
            self._after_stop = True
            return []
        return held

    def _show(self, line: str) -> None:
        if not self.verbose and is_info_line(line):  # the round-by-round log: in the file
            if self.progress is not None:
                self.progress.feed(line)
            return
        if self.progress is not None:
            self.progress.echo(line)
            self.progress.feed(line)
        else:
            sys.stdout.write(line if sys.stdout.isatty() else ANSI.sub("", line))
            sys.stdout.flush()

    def close(self) -> None:
        held, self._held = self._held, []
        for line in held:  # a crash report cut short: shown as it is
            self._show(line)
        if not self.file.closed:
            self.file.close()
        if self.progress is not None:
            self.progress.close()
