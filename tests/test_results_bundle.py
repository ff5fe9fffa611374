"""Results that travel home in the run's log: whole, checked, and never a stray file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gems_fl.evaluation.results_bundle import ALLOWED, BundleError, BundleReader, bundle_lines


def _files(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"status": "completed", "rows": {"GEMS": {"accuracy": 0.9}},
                                   "pad": "x" * 20000}))
    model = tmp_path / "gems_model.npz"
    np.savez(model, weight=np.random.default_rng(0).normal(size=(10, 785)))
    return {"results.json": results, "gems_model.npz": model}


def test_a_bundle_comes_back_byte_for_byte_in_any_order_among_other_lines(tmp_path):
    files = _files(tmp_path)
    lines = bundle_lines(7, files)
    assert len(lines) > 4 and all(len(line) < 4200 for line in lines)
    reader = BundleReader()
    shown = [line for line in ["INFO : Round 1", *reversed(lines), "INFO : done"]
             if not reader.feed(line)]
    assert shown == ["INFO : Round 1", "INFO : done"]
    written = reader.write(7, tmp_path / "home")
    for name, path in files.items():
        assert written[name].read_bytes() == path.read_bytes()


def test_a_cut_or_damaged_bundle_is_refused_with_what_is_wrong(tmp_path):
    lines = bundle_lines(3, _files(tmp_path))
    reader = BundleReader()
    for line in lines[:-1]:
        reader.feed(line)
    with pytest.raises(BundleError, match="parts missing"):
        reader.files(3)
    damaged = BundleReader()
    for line in lines:
        damaged.feed(line.replace("A", "B") if " part=1 " in line else line)
    with pytest.raises(BundleError, match="checksum|damaged"):
        damaged.files(3)
    with pytest.raises(BundleError, match="carries no results"):
        BundleReader().files(3)


def test_only_results_files_can_travel_and_be_written(tmp_path):
    evil = tmp_path / "x.sh"
    evil.write_text("rm -rf /")
    with pytest.raises(ValueError, match="not a results file"):
        bundle_lines(1, {"x.sh": evil})
    reader = BundleReader()
    reader.feed("GEMS-FL-BUNDLE run=1 file=..%2fx parts=1 bytes=1 sha256=" + "0" * 64)
    assert reader.runs() == set()  # a name outside [\w.-] is not even parsed
    assert set(ALLOWED) == {"results.json", "gems_model.npz"}
