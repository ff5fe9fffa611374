"""The guides say only what this checkout does: every command of a code block uses flags
its program has (each program's own --help), every run setting it passes exists, every
repository path it or its text names exists, and the commands that can run on loopback
(certificates, check-data) run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

from gems_fl.running.run_config import parse_run_config
from gems_fl.settings import Settings
from tests.helpers import ROOT

GUIDES = ("README.md", "deploy/README.md", "results/README.md",
          *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
#: the front page stays a front page (issue 43: at most 250 lines)
README_MAX_LINES = 250
REPO_PATH = re.compile(r"(?<![\w/.-])((?:gems_fl|deploy|tests|benchmarks|results|\.ci)/[\w./-]*\w)")


def _commands(guide: str) -> list[list[str]]:
    """Each command of the guide's bash blocks, continuation lines joined, comments cut."""
    text = (ROOT / guide).read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line.replace("<run id>", "7").replace("<id>", "7")))
    return out


@cache
def _help(*program: str) -> str:
    proc = subprocess.run([*program, "--help"], capture_output=True, text=True, timeout=120,
                          check=False, env={"COLUMNS": "400", "PATH": _path()})
    assert proc.returncode == 0, f"{' '.join(program)} --help failed: {proc.stderr[-500:]}"
    return proc.stdout


def _path() -> str:
    import os

    return os.environ["PATH"]


def _gems_fl_options(sub: str) -> set[str]:
    from gems_fl.running.cli import build_parser

    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return {opt for a in action.choices[sub]._actions for opt in a.option_strings}


def _flwr_program(tokens: list[str]) -> tuple[str, ...]:
    """``("flwr", "supernode", "register")`` for ``flwr supernode register ...``."""
    words = ["flwr"]
    for token in tokens[1:]:
        if token.startswith("-") or token in (".", "gems-tls") or not token.isalpha():
            break
        words.append(token)
        if token not in ("supernode", "federation"):
            break
    return tuple(words)


@pytest.mark.parametrize("guide", GUIDES)
def test_every_command_in_the_guides_uses_flags_and_settings_that_exist(guide):
    checked = 0
    for tokens in _commands(guide):
        flags = [t.split("=")[0] for t in tokens if t.startswith("--")]
        program = tokens[0]
        if program == "gems-fl":
            known = _gems_fl_options(tokens[1])
            assert set(flags) <= known, (guide, tokens, sorted(set(flags) - known))
            if "--run-config" in tokens:
                overrides = parse_run_config(tokens[tokens.index("--run-config") + 1])
                Settings.from_run_config(overrides)
                from tests.helpers import app_defaults

                assert set(overrides) <= set(app_defaults()), (guide, tokens)
        elif program in ("flower-superlink", "flower-supernode"):
            text = _help(program)
            assert all(f in text for f in flags), (guide, program, [f for f in flags if f not in text])
        elif program == "flwr":
            words = _flwr_program(tokens)
            text = _help(*words)
            assert all(f in text for f in flags), (guide, words, [f for f in flags if f not in text])
        elif program in ("python3", "bash") or program.startswith("deploy/"):
            for token in tokens:
                if REPO_PATH.fullmatch(token) or token.endswith((".py", ".sh")):
                    assert (ROOT / token).exists(), (guide, token)
        else:
            continue
        checked += 1
    assert checked >= (5 if guide in ("README.md", "deploy/README.md") else 0)


@pytest.mark.parametrize("guide", GUIDES)
def test_every_repository_path_the_guides_name_exists(guide):
    text = (ROOT / guide).read_text()
    names = sorted({m for m in REPO_PATH.findall(text) if "<" not in m and "*" not in m})
    missing = [n for n in names if not (ROOT / n).exists() and not
               (n.startswith(("gems-results", "deploy/out", "benchmarks/out")))]
    assert names and not missing, missing


def test_the_loopback_commands_of_the_deploy_guide_run(tmp_path):
    """Step 2 (certificates) and the check-data call of step 4, on this machine."""
    certs = subprocess.run(["bash", str(ROOT / "deploy" / "make-certs.sh"), str(tmp_path / "certs"),
                            "127.0.0.1"], capture_output=True, text=True, check=False, timeout=120)
    assert certs.returncode == 0, certs.stderr
    for name in ("ca.crt", "server.crt", "server.key"):
        assert (tmp_path / "certs" / name).is_file()
    from tests.sitegen import site_config

    site = site_config(tmp_path / "sites", "site-a", seed=0)
    (command,) = [t for t in _commands("deploy/README.md") if t[:2] == ["gems-fl", "check-data"]]
    args = [site["data-path"] if t.startswith("/srv/") else t for t in command[2:]]
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "check-data", *args],
                          capture_output=True, text=True, check=False, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": _path()})
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("guide", GUIDES)
def test_every_pytest_command_in_the_guides_selects_tests(guide):
    """A rehearsal command a guide gives runs tests when pasted: the project's addopts
    deselect the slow tier, so a command for a slow file must say `-m slow`."""
    commands = [t for t in _commands(guide) if t[:3] == ["python3", "-m", "pytest"]]
    for command in commands:
        proc = subprocess.run([sys.executable, "-m", "pytest", *command[3:], "--collect-only",
                               "-q", "-p", "no:cacheprovider", "-n", "0"], cwd=ROOT,
                              capture_output=True, text=True, check=False, timeout=300)
        assert proc.returncode == 0, (command, proc.stdout[-2000:])
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout)
        assert collected and int(collected.group(1)) > 0, (command, proc.stdout[-500:])


def test_one_install_story_for_torch():
    """Every guide installs torch the way README.md does: the CPU build's index (a plain
    `pip install torch` pulls the CUDA build), never a bare pinned version."""
    readme = [t for t in _commands("README.md") if "torch" in t and "install" in t]
    assert readme and all("--index-url" in t for t in readme)
    for guide in GUIDES:
        for tokens in _commands(guide):
            if "install" in tokens and any(t.startswith("torch") for t in tokens):
                assert "--index-url" in tokens and tokens[tokens.index("--index-url") + 1] == \
                    readme[0][readme[0].index("--index-url") + 1], (guide, tokens)


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    for link in re.findall(r"\]\(((?:docs|results|deploy)/[^)#]+|CHANGELOG\.md)\)",
                           "\n".join(lines)):
        assert (ROOT / link).exists(), link


def test_the_layout_page_names_every_sub_package_and_no_other():
    text = (ROOT / "docs" / "layout.md").read_text()
    named = set(re.findall(r"^\| `gems_fl/(\w+)/`", text, re.M))
    on_disk = {p.parent.name for p in (ROOT / "gems_fl").glob("*/__init__.py")}
    assert named == on_disk, (sorted(named - on_disk), sorted(on_disk - named))
    modules = set(re.findall(r"`gems_fl/(\w+\.py)`", text))
    top = {p.name for p in (ROOT / "gems_fl").glob("*.py") if p.name != "__init__.py"}
    assert top <= modules, sorted(top - modules)


def test_the_architecture_page_names_functions_and_rooms_that_exist():
    """docs/architecture.md's path of one run names real functions, classes and dataclass
    fields (a ``ModelKind``'s ``map_rule``), and its picture every sub-package."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    source = "\n".join(p.read_text() for p in (ROOT / "gems_fl").rglob("*.py"))
    defined = set(re.findall(r"^\s*(?:def|class) (\w+)", source, re.M))
    defined |= set(re.findall(r"^    (\w+): [\w\[\]., |]+(?: = .*)?$", source, re.M))
    named = {n.split(".")[-1] for n in re.findall(r"`([A-Za-z_][\w.]*)`", text)
             if re.fullmatch(r"_?[a-z]+(?:_[a-z]+)+|[A-Z][a-z]+[A-Z]\w*|Settings(?:\.\w+)?", n)}
    assert named and named <= defined, sorted(named - defined)
    rooms = set(re.findall(r'^\s+\w+\["(\w+)/', text, re.M))
    on_disk = {p.parent.name for p in (ROOT / "gems_fl").glob("*/__init__.py")}
    assert rooms == on_disk, (sorted(rooms - on_disk), sorted(on_disk - rooms))
