"""Where a reproduction keeps its trials' outcomes: one JSON Lines file per study.

``<out>/trials/study<N>.jsonl`` holds, one line each, ``{"name": ..., "record": ...}`` for
every finished trial whose first study is ``N``; a line is appended the moment its trial
finishes, so an interrupted reproduction resumes where it stopped. A last line cut short
by a crash is left out with a warning (that trial runs again). Folders written before
(one ``<name>.json`` file per trial) are read as they are and packed into the study files
by the next reproduction that runs in them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

__all__ = ["TrialStore"]

log = logging.getLogger(__name__)


class TrialStore:
    """The stored outcomes under ``folder/trials``, by trial name."""

    def __init__(self, folder: Path) -> None:
        self.dir = Path(folder) / "trials"

    @staticmethod
    def file_name(record: dict) -> str:
        """The study file a record belongs in: its first study's (``study0`` for none)."""
        studies = record.get("studies") or [0]
        return f"study{min(int(s) for s in studies)}.jsonl"

    def _legacy(self) -> list[Path]:
        return sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []

    @property
    def has_legacy_files(self) -> bool:
        """Whether outcomes lie in one-file-per-trial files (written before the study
        files): :meth:`write_all` packs them."""
        return bool(self._legacy())

    def load(self) -> dict[str, dict]:
        """Every stored record by trial name (a name stored twice: the later line)."""
        records: dict[str, dict] = {}
        for path in self._legacy():
            records[path.stem] = json.loads(path.read_text())
        for path in sorted(self.dir.glob("*.jsonl")) if self.dir.is_dir() else []:
            lines = path.read_text().splitlines()
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    records[entry["name"]] = entry["record"]
                except (ValueError, KeyError, TypeError):
                    if number < len(lines):
                        raise ValueError(f"{path}: line {number} is not a stored trial "
                                         "({\"name\": ..., \"record\": ...}); the file "
                                         "was edited by hand?") from None
                    log.warning("%s: its last line was cut short (an interrupted run?); "
                                "that trial runs again", path)
        return records

    def add(self, name: str, record: dict) -> None:
        """Append one finished trial to its study file."""
        self.dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"name": name, "record": record})
        with (self.dir / self.file_name(record)).open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_all(self, records: dict[str, dict]) -> None:
        """Rewrite the study files to hold exactly ``records`` (each file replaced whole,
        atomically), and remove the one-file-per-trial files they replace."""
        self.dir.mkdir(parents=True, exist_ok=True)
        files: dict[str, list[str]] = {}
        for name, record in records.items():
            files.setdefault(self.file_name(record), []).append(
                json.dumps({"name": name, "record": record}))
        for file, lines in files.items():
            tmp = self.dir / f".{file}.tmp"
            tmp.write_text("".join(f"{line}\n" for line in lines))
            tmp.replace(self.dir / file)
        for path in sorted(self.dir.glob("*.jsonl")):
            if path.name not in files:
                path.unlink()
        for path in self._legacy():
            path.unlink()
