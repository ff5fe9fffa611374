"""Results that come home: ``results.json`` and the model through the run's log stream.

On a deployed SuperLink the ServerApp writes its results on the SuperLink's machine. The
one channel Flower 1.42 (open source) gives back to the machine that submitted the run is
the run's log: the ServerApp's output is kept by the SuperLink and streamed by ``flwr run
--stream`` and ``flwr log`` (``flwr pull`` needs an artifact provider, which only Flower
Enterprise configures). So at the end of a run the ServerApp prints both files as
compressed, base64-encoded lines with a checksum (:func:`bundle_lines`), and the
submitting side collects them from the stream (:class:`BundleReader`), checks them and
writes them under its own output folder. The launcher never shows these lines.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

MARK = "GEMS-FL-BUNDLE"
CHUNK_CHARS = 4000
HEADER = re.compile(rf"{MARK} run=(\d+) file=([\w.-]+) parts=(\d+) bytes=(\d+) sha256=([0-9a-f]{{64}})")
PART = re.compile(rf"{MARK} run=(\d+) file=([\w.-]+) part=(\d+) ([A-Za-z0-9+/=]+)")
ALLOWED = ("results.json", "gems_model.npz")  # nothing else may be written from a log


class BundleError(RuntimeError):
    """The log did not carry a whole, intact bundle."""


def bundle_lines(run_id: int, files: dict[str, Path]) -> list[str]:
    """The lines that carry ``files`` (``{name: path}``; names from :data:`ALLOWED`)."""
    lines = []
    for name, path in files.items():
        if name not in ALLOWED:
            raise ValueError(f"{name!r} is not a results file ({', '.join(ALLOWED)})")
        raw = Path(path).read_bytes()
        text = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
        parts = [text[i:i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
        lines.append(f"{MARK} run={run_id} file={name} parts={len(parts)} bytes={len(raw)} "
                     f"sha256={hashlib.sha256(raw).hexdigest()}")
        lines.extend(f"{MARK} run={run_id} file={name} part={i} {part}"
                     for i, part in enumerate(parts) if part)
    return lines


def is_bundle_line(line: str) -> bool:
    return MARK in line


@dataclass
class _Pending:
    parts: int
    size: int
    digest: str
    chunks: dict[int, str] = field(default_factory=dict)


class BundleReader:
    """Collects bundle lines from a log (in any order) and hands back verified files."""

    def __init__(self) -> None:
        self._files: dict[tuple[int, str], _Pending] = {}
        self._orphans: dict[tuple[int, str], dict[int, str]] = {}

    def feed(self, line: str) -> bool:
        """Take one log line; True when it was a bundle line (not to be shown)."""
        if MARK not in line:
            return False
        header = HEADER.search(line)
        if header:
            run_id, name, parts, size, digest = header.groups()
            key = (int(run_id), name)
            pending = _Pending(int(parts), int(size), digest)
            pending.chunks.update(self._orphans.pop(key, {}))
            self._files[key] = pending
            return True
        part = PART.search(line)
        if part:
            run_id, name, index, chunk = part.groups()
            key = (int(run_id), name)
            target = self._files[key].chunks if key in self._files else \
                self._orphans.setdefault(key, {})
            target[int(index)] = chunk
        return True

    def runs(self) -> set[int]:
        return {run_id for run_id, _ in self._files}

    def files(self, run_id: int) -> dict[str, bytes]:
        """``{name: content}`` of ``run_id``'s bundle, each checked against its checksum."""
        out = {}
        for (rid, name), pending in sorted(self._files.items()):
            if rid != run_id:
                continue
            if name not in ALLOWED:
                raise BundleError(f"the log names {name!r}, which is not a results file")
            missing = [i for i in range(pending.parts) if i not in pending.chunks]
            if missing:
                raise BundleError(f"{name}: {len(missing)} of {pending.parts} parts missing "
                                  "from the log (the log stream was cut short)")
            text = "".join(pending.chunks[i] for i in range(pending.parts))
            try:
                raw = zlib.decompress(base64.b64decode(text))
            except (ValueError, zlib.error) as exc:
                raise BundleError(f"{name}: the log's copy is damaged ({exc})") from None
            if len(raw) != pending.size or hashlib.sha256(raw).hexdigest() != pending.digest:
                raise BundleError(f"{name}: the log's copy does not match its checksum")
            out[name] = raw
        if "results.json" not in out:
            raise BundleError(f"the log of run {run_id} carries no results (the ServerApp "
                              "ended before writing them, or predates this version)")
        return out

    def write(self, run_id: int, folder: Path) -> dict[str, Path]:
        """Write ``run_id``'s verified files into ``folder``; ``{name: path}``."""
        files = self.files(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        written = {}
        for name, raw in files.items():
            path = folder / name
            partial = folder / f".{name}.partial"
            partial.write_bytes(raw)
            partial.replace(path)
            written[name] = path
        return written
