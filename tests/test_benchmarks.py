"""The benchmark suite's rules, checked on the scripts themselves: every benchmark goes
through the harness (declares a tiny ``SMOKE`` size that ``benchmarks/smoke.py`` and CI
run, writes the JSON envelope of ``benchmarks/envelope.py``) and is listed in
``benchmarks/README.md``."""

from __future__ import annotations

import ast
import sys

import pytest

from tests.helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"
HELPERS = {"envelope", "smoke", "inprocess_run"}
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.stem not in HELPERS)


def _calls(tree: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == name
               for n in ast.walk(tree))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_runs_through_the_harness(script):
    sys.path.insert(0, str(BENCHMARKS))
    from smoke import smoke_runs

    tree = ast.parse(script.read_text())
    assert smoke_runs(script), f"{script.name} declares no SMOKE size"
    assert _calls(tree, "write_envelope"), f"{script.name} does not write the envelope"
    text = script.read_text()
    assert "json.dump(" not in text and "write_text(json.dumps" not in text, \
        f"{script.name} writes its own JSON"
    assert f"`{script.name}`" in (BENCHMARKS / "README.md").read_text()


def test_the_readme_lists_no_benchmark_that_is_gone():
    import re

    text = (BENCHMARKS / "README.md").read_text()
    table = text[text.index("| script | what it measures |"):]  # the live table, not the retired
    table = table[:table.index("\n\n")] if "\n\n" in table else table
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", table, re.M))
    assert listed == {p.stem for p in SCRIPTS}
