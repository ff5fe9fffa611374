"""``gems-fl predict RUN_FOLDER FILE``: score a finished run's model on a user's own rows.

Prints the accuracy, a per-class table and the confusion counts when the file holds
labels, and writes each row's predicted class and class probabilities to a CSV.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import TextIO

import numpy as np

from gems_fl.api import GEMSModel, load_model
from gems_fl.data.scoring_rows import ScoringRows, read_scoring_rows
from gems_fl.data.site_files import sort_classes


def predict_file(run_folder: str | Path, file: str | Path, label_column: str = "",
                 out_path: str | Path | None = None, out: TextIO | None = None) -> int:
    """Score ``file`` with the model of ``run_folder``; the exit status (0, or 2 for an
    input the message names). Prints to ``out`` (default: standard output)."""
    out = sys.stdout if out is None else out
    try:
        model = load_model(run_folder)
        rows = read_scoring_rows(file, model.feature_names, model.num_features, label_column,
                                 model.categories)
    except (FileNotFoundError, ValueError) as exc:  # SiteFileError is a ValueError
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    probabilities = model.predict_proba(rows.x)
    predicted = np.asarray(model.classes, dtype=object)[probabilities.argmax(axis=1)].astype(str)
    target = Path(out_path) if out_path else _default_path(run_folder, file)
    print(f"gems-fl predict: {len(rows.x):,} rows of {file}, scored by the model in "
          f"{_folder(run_folder)} ({len(model.classes)} classes)", file=out)
    if rows.ignored:
        print(f"left out {len(rows.ignored)} column(s) the model does not take: "
              f"{', '.join(rows.ignored)}", file=out)
    if rows.labels is None:
        print("no label column: predictions only (name one with --label-column to score them)",
              file=out)
    else:
        _print_scores(rows, predicted, model, out)
    _write(target, rows, predicted, probabilities, model)
    print(f"predictions: {target} (row, predicted"
          + (", label" if rows.labels is not None else "") + ", one probability per class)",
          file=out)
    return 0


def _folder(run_folder: str | Path) -> Path:
    folder = Path(run_folder).expanduser()
    return folder.parent if folder.is_file() else folder


def _default_path(run_folder: str | Path, file: str | Path) -> Path:
    return _folder(run_folder) / f"predictions-{Path(file).stem}.csv"


def _print_scores(rows: ScoringRows, predicted: np.ndarray, model: GEMSModel, out: TextIO) -> None:
    from sklearn.metrics import confusion_matrix

    labels = rows.labels
    correct = predicted == labels
    print(f"label column: {rows.label_column}", file=out)
    print(f"accuracy {correct.mean():.4f} ({int(correct.sum()):,} of {len(labels):,} rows)",
          file=out)
    unknown = sort_classes(set(labels.tolist()) - set(model.classes))
    if unknown:
        print(f"note: label(s) {', '.join(unknown)} are not among the model's classes "
              f"({', '.join(model.classes)}); their rows count as errors", file=out)
    classes = list(model.classes) + unknown
    width = max(5, *(len(c) for c in classes))
    print(f"\n{'class':<{width}}  {'rows':>6}  {'predicted':>9}  {'correct':>7}  {'recall':>6}  "
          f"{'precision':>9}", file=out)
    for name in classes:
        held, said = labels == name, predicted == name
        hits = int((held & said).sum())
        recall = f"{hits / held.sum():.3f}" if held.any() else "-"
        precision = f"{hits / said.sum():.3f}" if said.any() else "-"
        print(f"{name:<{width}}  {int(held.sum()):>6}  {int(said.sum()):>9}  {hits:>7}  "
              f"{recall:>6}  {precision:>9}", file=out)
    counts = confusion_matrix(labels, predicted, labels=classes)
    cell = max(width, *(len(str(int(v))) for v in counts.ravel()))
    print("\nconfusion counts (row: the label; column: the predicted class)", file=out)
    print(" " * width + "".join(f"  {name:>{cell}}" for name in classes), file=out)
    for name, line in zip(classes, counts):
        print(f"{name:<{width}}" + "".join(f"  {int(v):>{cell}}" for v in line), file=out)
    print(file=out)


def _write(target: Path, rows: ScoringRows, predicted: np.ndarray, probabilities: np.ndarray,
           model: GEMSModel) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="") as f:
        writer = csv.writer(f)
        labelled = rows.labels is not None
        writer.writerow(["row", "predicted", *(["label"] if labelled else []),
                         *(f"p_{c}" for c in model.classes)])
        for i, name in enumerate(predicted):
            writer.writerow([i + 1, name, *([rows.labels[i]] if labelled else []),
                             *(f"{p:.6g}" for p in probabilities[i])])

