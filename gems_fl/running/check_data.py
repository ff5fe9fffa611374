"""``gems-fl check-data FILE [FILE ...]``: read sites' files the way their nodes will,
before a run.

Prints the format, each split's shape, class counts, NaN/inf, missing arrays or files,
and what a run would reject; with two or more files, also whether they agree with each
other as a run matches them (the number of features, and with header rows the column
names, in any order). Exit status 0 when a node with each file would take part, 1 when
one would be left out (the printed lines say why).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

import numpy as np

from gems_fl.data.nodes import site_notes
from gems_fl.data.site_columns import ID_AUTO, column_difference, vote_columns
from gems_fl.data.site_files import (
    SPLITS,
    SiteFile,
    SiteFileError,
    class_counts,
    complete_categories,
    parse_classes,
    read_site_file,
    site_problems,
    split_validation,
)


def check_data(paths: str | list[str], *, features: int | None = None, classes: str = "",
               label_column: str = "", id_columns: str = ID_AUTO, val_fraction: float = 0.2,
               categories: str = "", out: TextIO | None = None) -> int:
    """Check site files, each alone and (two or more) against each other; print the
    report to ``out``; return the exit status."""
    out = out or sys.stdout
    paths = [paths] if isinstance(paths, str) else list(paths)
    sites: dict[str, SiteFile] = {}
    status = 0
    for path in paths:
        code, site = _check_one(path, features, classes, label_column, out, id_columns,
                                val_fraction, categories)
        status = max(status, code)
        if site is not None and code == 0:
            sites[path] = site
    if len(paths) > 1:
        status = max(status, _check_together(sites, features, out))
    return status


def _check_together(sites: dict[str, SiteFile], features: int | None, out: TextIO) -> int:
    """The files against each other, as a run's identity round matches them: the number
    of features most files have (unless ``--features`` fixed it), then by column name
    where every file has a header row."""
    say = lambda text="": print(text, file=out)
    say("together:")
    if len(sites) < 2:
        say("  (fewer than two files passed alone; nothing to compare)")
        return 0
    _say_categories(sites, say)
    named = {p: s.columns for p, s in sites.items() if s.columns is not None}
    status = _check_feature_counts(sites, features, named, say)
    if status is None:
        return 1
    if named and len(named) == len(sites):
        status = max(status, _check_column_names(sites, named, say))
    elif named:
        say("  note: some files have a header row and some do not; columns are then matched "
            "by position")
    if status == 0:
        say(f"  OK: the {len(sites)} files agree on "
            f"{next(iter(sites.values())).num_features()} features"
            + (" by column name" if named and len(named) == len(sites) else " (by position)"))
    return status


def _check_feature_counts(sites: dict[str, SiteFile], features: int | None,
                          named: dict[str, list[str]], say) -> int | None:
    """Without ``--features``, the files against the count most of them hold: 1 where one
    differs, 0 where none does, None where no count is held by most (nothing to blame)."""
    counts = Counter(site.num_features() for site in sites.values())
    if features is not None or len(counts) <= 1:
        return 0
    common = max(counts, key=lambda n: (counts[n], -n))
    if counts[common] * 2 <= len(sites):
        say("  REJECTED: the files disagree on the number of features and no count is "
            "held by most of them: " + ", ".join(f"{path} has {site.num_features()}"
                                                  for path, site in sites.items()))
        for line in _column_disagreements(named):
            say(f"    {line}")
        say("  a run keeps the count most sites report (or num-features); make the files "
            "agree, or set num-features to the count the run should keep")
        return None
    status = 0
    for path, site in sites.items():
        if site.num_features() != common:
            say(f"  REJECTED: {path} has {site.num_features()} features; {counts[common]} of "
                f"{len(sites)} files have {common}")
            status = 1
    return status


def _check_column_names(sites: dict[str, SiteFile], named: dict[str, list[str]], say) -> int:
    """Every file with a header row against the columns the identity round would vote
    for: 1 where one lacks or adds a column."""
    train_rows = {p: len(s.y.get("train", ())) for p, s in sites.items()}
    reference, holders = vote_columns(named, train_rows)
    reference_path, status = holders[0], 0
    for path, columns in named.items():
        problem = column_difference(columns, reference, reference_path)
        if problem:
            say(f"  REJECTED: {path} {problem}")
            status = 1
        elif columns != reference:
            say(f"  note: {path} holds the columns of {reference_path} in another order; a "
                "run matches them by name")
    return status


def _say_categories(sites: dict[str, SiteFile], say) -> None:
    """Give every file every category value any holds, as a run does; say which."""
    for base, values in complete_categories(list(sites.values())).items():
        say(f"  category column {base}: {len(values)} value(s) over the files ("
            f"{', '.join(values)}); a run gives each file all of them")


def _column_disagreements(named: dict[str, list[str]]) -> list[str]:
    """For files with header rows: the columns each lacks or has beyond the others'."""
    if len(named) < 2:
        return []
    every = set.intersection(*(set(c) for c in named.values()))
    some = set.union(*(set(c) for c in named.values()))
    lines = []
    for path, columns in named.items():
        lacks = [c for c in sorted(some) if c not in columns]
        extra = [c for c in columns if c not in every]
        if lacks or extra:
            lines.append(f"{path}: " + "; ".join(
                ([f"lacks {', '.join(lacks)}"] if lacks else [])
                + ([f"has {', '.join(extra)} that not every file has"] if extra else [])))
    return lines


def _describe_site(site: SiteFile, path: str, label_column: str, say) -> None:
    """The file's format, each split's shape and non-finite values, its classes' counts."""
    suffix = Path(path).suffix.lower()
    say(f"  format: {suffix[1:]}" + ("" if suffix == ".npz" else
        f" (label column: {label_column or 'last'}, counted from 0; optional <stem>_val.csv "
        "and <stem>_test.csv)"))
    for split in SPLITS:
        if split not in site.x:
            say(f"  {split}: none" + (" (optional; a node can split one off with its "
                                      "test-fraction node config)" if split == "test" else ""))
            continue
        x = site.x[split]
        nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
        say(f"  {split}: x {tuple(x.shape)}, y {tuple(site.y[split].shape)}, NaN {nan}, inf {inf}")
    counts = class_counts(site)
    say(f"  classes ({len(site.labels)}): {', '.join(site.labels)}")
    for split, per_class in counts.items():
        say(f"    {split}: " + ", ".join(f"{name} {n}" for name, n in per_class.items()))


def _class_list(site: SiteFile, wanted: list[str] | int | None, say) -> list[str] | None:
    """The run's class names to check the file against (``--classes``: names, or a count
    where the file's labels are numbers), or None."""
    if isinstance(wanted, list):
        return wanted
    if isinstance(wanted, int):
        if all(label.lstrip("-").isdigit() for label in site.labels):
            return [str(i) for i in range(wanted)]
        if len(site.labels) > wanted:
            say(f"  note: the file holds {len(site.labels)} class names, the run {wanted}")
    return None


def _check_one(path: str, features: int | None, classes: str, label_column: str,
               out: TextIO, id_columns: str = ID_AUTO, val_fraction: float = 0.2,
               categories: str = "") -> tuple[int, SiteFile | None]:
    """One file alone: its report, its exit status and the file read (None: unreadable)."""
    say = lambda text="": print(text, file=out)
    say(f"{path}:")
    try:
        wanted = parse_classes(classes)
    except ValueError as exc:
        say(f"  REJECTED: {exc}")
        return 1, None
    try:
        site = read_site_file(path, label_column, id_columns=id_columns, categories=categories)
        split_validation(site, val_fraction, 0)  # the per-class counts a node's split gives
    except SiteFileError as exc:
        say(f"  REJECTED: {exc}")
        return 1, None
    _describe_site(site, path, label_column, say)
    class_list = _class_list(site, wanted, say)
    if site.columns is not None:
        say(f"  feature columns ({len(site.columns)}): {', '.join(site.columns)}")
    for note in site_notes(site):
        say(f"  note: {note}")
    problems = site_problems(site, features, class_list)
    if problems:
        for problem in problems:
            say(f"  REJECTED: {problem}")
        return 1, site
    say("  OK: a node with this file takes part" + (
        "" if features or class_list else " (pass --features/--classes to check it against "
        "the run's, or several sites' files to check them against each other)"))
    return 0, site
