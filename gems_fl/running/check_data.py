"""``gems-fl check-data FILE``: read a site's file the way its node will, before a run.

Prints the format, each split's shape, class counts, NaN/inf, missing arrays or files,
and what a run would reject; exit status 0 when a node with this file would take part,
1 when it would be left out (the printed lines say why).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import numpy as np

from gems_fl.data.site_files import (
    SPLITS,
    SiteFileError,
    class_counts,
    parse_classes,
    read_site_file,
    site_problems,
)


def check_data(path: str, *, features: int | None = None, classes: str = "",
               label_column: str = "", out: TextIO | None = None) -> int:
    """Check one site file; print the report to ``out``; return the exit status."""
    out = out or sys.stdout
    say = lambda text="": print(text, file=out)
    say(f"{path}:")
    try:
        wanted = parse_classes(classes)
    except ValueError as exc:
        say(f"  REJECTED: {exc}")
        return 1
    try:
        site = read_site_file(path, label_column)
    except SiteFileError as exc:
        say(f"  REJECTED: {exc}")
        return 1
    suffix = Path(path).suffix.lower()
    say(f"  format: {suffix[1:]}" + ("" if suffix == ".npz" else
        f" (label column: {label_column or 'last'}; <stem>_val.csv and optional <stem>_test.csv)"))
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
    class_list = None
    if isinstance(wanted, list):
        class_list = wanted
    elif isinstance(wanted, int):
        if all(label.lstrip("-").isdigit() for label in site.labels):
            class_list = [str(i) for i in range(wanted)]
        elif len(site.labels) > wanted:
            say(f"  note: the file holds {len(site.labels)} class names, the run {wanted}")
    problems = site_problems(site, features, class_list)
    if problems:
        for problem in problems:
            say(f"  REJECTED: {problem}")
        return 1
    say("  OK: a node with this file takes part" + (
        "" if features or class_list else " (pass --features/--classes to check it against "
        "the run's)"))
    return 0
