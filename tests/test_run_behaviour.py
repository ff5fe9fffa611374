"""`gems-fl run` behaves: clean interrupts, errors before work, progress, complete results."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from gems_fl.data import write_idx
from gems_fl.evaluation.results import RESULTS_FILE, write_results
from gems_fl.running import launch
from gems_fl.running.cli import main
from gems_fl.running.processes import marked_processes, processes_using
from gems_fl.running.run_config import parse_run_config
from gems_fl.running.runlog import Progress, summarise_errors
from gems_fl.serverapp.preflight import PreflightError, preflight
from gems_fl.settings import Settings
from gems_fl.settings.checks import USER_MEANING_MAX
from gems_fl.settings.doc import meaning, reference_markdown, settings_markdown, settings_table, user_keys
from tests.helpers import ROOT, app_defaults, run_in_process

FAST = "num-directions=30 local-max-epochs=15 public-samples=200"


def write_mnist_like(folder: Path, *, gz: bool = False, bad_label: bool = False) -> Path:
    """Four small IDX files (120 train, 20 test 28x28 images) that pass every header check."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    y_train = (np.arange(120) % 10).astype(np.uint8)
    if bad_label:
        y_train[5] = 12  # only the loader, on the nodes, reads label values
    suffix = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{suffix}",
              rng.integers(0, 255, (120, 28, 28)).astype(np.uint8))
    write_idx(folder / f"train-labels-idx1-ubyte{suffix}", y_train)
    write_idx(folder / f"t10k-images-idx3-ubyte{suffix}",
              rng.integers(0, 255, (20, 28, 28)).astype(np.uint8))
    write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", (np.arange(20) % 10).astype(np.uint8))
    return folder


@pytest.fixture
def no_processes(monkeypatch):
    """Fail the test if `gems-fl run` gets as far as starting a SuperLink."""
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started although a preflight check should fail")
    monkeypatch.setattr(launch, "LocalSuperLink", refuse)


def run_cli_fails(capsys, args: list[str]) -> str:
    """Run `gems-fl run ARGS` in-process: exit 2, one line on stderr, nothing started
    (the ``no_processes`` fixture fails the test if a SuperLink is started)."""
    code = main(["run", str(ROOT), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---- preflight: one message naming the setting, exit 2, nothing started ----------------


def test_preflight_more_label_groups_than_nodes(capsys, tmp_path, no_processes):
    line = run_cli_fails(capsys, ["--nodes", "3", "--output-dir", str(tmp_path), "--run-config",
                                  "label-division='0,1/2,3/4,5/6,7/8,9'"])
    assert "label-division" in line and "5 group(s)" in line and "3 nodes" in line


def test_preflight_paper_division_has_no_11_nodes(capsys, tmp_path, no_processes):
    line = run_cli_fails(capsys, ["--nodes", "11", "--output-dir", str(tmp_path)])
    assert "label-division" in line and "11 nodes" in line


def test_preflight_refuses_nodes_that_would_get_too_little_data(capsys, tmp_path, no_processes):
    # digits holds 128 validation samples: iid over 200 nodes leaves nodes without any.
    line = run_cli_fails(capsys, ["--nodes", "200", "--output-dir", str(tmp_path),
                                  "--run-config", "label-division='iid'"])
    assert "label-division 'iid'" in line and "200 nodes" in line and "at most" in line


def test_preflight_fewer_nodes_than_min_replies(capsys, tmp_path, no_processes):
    line = run_cli_fails(capsys, ["--nodes", "1", "--output-dir", str(tmp_path)])
    assert "min-replies=2" in line and "--nodes 1" in line


def test_preflight_fashion_mnist_with_an_empty_data_dir(capsys, tmp_path, no_processes):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = run_cli_fails(capsys, ["--nodes", "5", "--output-dir", str(tmp_path / "out"),
                                  "--run-config", f"dataset='fashion-mnist' data-dir='{empty}'"])
    assert f"data-dir='{empty}'" in line and "train-images-idx3-ubyte" in line


def test_preflight_truncated_gz(capsys, tmp_path, no_processes):
    data = write_mnist_like(tmp_path / "data", gz=True)
    path = data / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    line = run_cli_fails(capsys, ["--nodes", "2", "--output-dir", str(tmp_path / "out"),
                                  "--run-config", f"dataset='mnist' data-dir='{data}'"])
    assert "data-dir=" in line and "train-images-idx3-ubyte.gz" in line
    assert "re-download" in line


def test_preflight_idx_size_disagrees_with_header(tmp_path):
    data = write_mnist_like(tmp_path / "data")
    path = data / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-3])
    settings = Settings(dataset="mnist", data_dir=str(data), output_dir=str(tmp_path / "out"))
    with pytest.raises(PreflightError, match="t10k-labels-idx1-ubyte holds 17 data bytes"):
        preflight(settings, 2)


def test_preflight_mnist_without_data_dir(capsys, tmp_path, no_processes):
    line = run_cli_fails(capsys, ["--nodes", "2", "--output-dir", str(tmp_path),
                                  "--run-config", "dataset='mnist'"])
    assert "data-dir is empty" in line and "dataset='mnist'" in line


@pytest.mark.parametrize("where", ["file", "below-file"])
def test_preflight_output_dir_not_a_writable_folder(capsys, tmp_path, no_processes, where):
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    target = blocker if where == "file" else blocker / "results"
    line = run_cli_fails(capsys, ["--nodes", "2", "--output-dir", str(target)])
    assert f"output-dir='{target}'" in line


def test_preflight_overlapping_division_needs_allow_overlap(capsys, tmp_path, no_processes):
    line = run_cli_fails(capsys, ["--nodes", "2", "--output-dir", str(tmp_path),
                                  "--run-config", "label-division='0,1/1,2'"])
    assert "label-division '0,1/1,2'" in line and "class 1" in line and "allow-overlap=true" in line
    allowed = Settings(label_division="0,1/1,2", allow_overlap=True, output_dir=str(tmp_path))
    preflight(allowed, 2)  # asked for: accepted
    preflight(Settings(label_division="paper", output_dir=str(tmp_path)), 2)  # the paper's K=2 overlaps


def test_preflight_passes_for_the_defaults_and_creates_nothing(tmp_path):
    out = tmp_path / "a" / "b"
    preflight(Settings(output_dir=str(out)), 5)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_preflight_server_side_without_node_count(tmp_path):
    preflight(Settings(dataset="mnist", evaluate_on_server=False, output_dir=str(tmp_path)),
              check_data=False)
    with pytest.raises(PreflightError, match="data-dir"):
        preflight(Settings(dataset="mnist", output_dir=str(tmp_path)))


# ---- --run-config values ----------------------------------------------------------------


def test_unquoted_string_names_the_key_and_the_quoted_form(capsys, no_processes):
    line = run_cli_fails(capsys, ["--run-config", "dataset=fashion-mnist"])
    assert "dataset=fashion-mnist" in line and "\"dataset='fashion-mnist'\"" in line


def test_run_config_parses_like_flwr():
    assert parse_run_config("eps=0.5 dataset='fashion-mnist' evaluate-on-server=false seed=3") == {
        "eps": 0.5, "dataset": "fashion-mnist", "evaluate-on-server": False, "seed": 3}
    assert parse_run_config('label-division="0,1/2,3"') == {"label-division": "0,1/2,3"}
    with pytest.raises(ValueError, match="'eps' is not key=value"):
        parse_run_config("eps")


# ---- version and help ----------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert re.match(r"gems-fl \d+\.\d+\.\d+ \(flwr \d", capsys.readouterr().out)


def test_run_help_lists_every_setting_with_default_and_meaning(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for key, default in app_defaults().items():
        shown = json.dumps(default) if isinstance(default, (str, bool)) else str(default)
        assert f"  {key} = {shown}\n" in out, key
    assert "the appendix table" in out


def test_settings_tables_are_generated_from_the_declarations():
    # `python -m gems_fl.settings.doc` prints the README's table of the user's settings,
    # `--reference` the whole of docs/settings.md
    assert settings_markdown() in (ROOT / "README.md").read_text()
    assert reference_markdown() == (ROOT / "docs" / "settings.md").read_text().rstrip("\n") + "\n"
    for f in fields(Settings):
        assert meaning(f.name.replace("_", "-"))


def test_the_readme_lists_about_25_user_settings_in_short_rows():
    rows = settings_table(user_only=True)
    assert 20 <= len(rows) <= 30, len(rows)
    assert all(len(text) <= USER_MEANING_MAX for _, _, text in rows)


def test_a_settings_mistake_is_reported_before_the_heavy_modules_load(tmp_path):
    """`gems-fl run` checks its settings, label division and node count before torch,
    scikit-learn or Flower's server side are imported, so a mistake is reported at once
    (benchmarks/error_latency.py times it; this checks the reason, not a clock)."""
    code = ("import sys\n"
            "from gems_fl.running.cli import main\n"
            "for args in (['--run-config', 'epss=1'], ['--run-config', \"label-division='dirichlet:x'\"],"
            " ['--nodes', '0']):\n"
            "    assert main(['run', *args]) == 2\n"
            "heavy = sorted(m for m in ('torch', 'sklearn', 'flwr.serverapp', 'gems_fl.serverapp.run')"
            " if m in sys.modules)\n"
            "print('heavy:', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "heavy: []", proc.stdout + proc.stderr
    assert proc.stderr.count("gems-fl: error:") == 3


def test_run_help_shows_the_user_settings_first(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    more = out.index("more settings")
    for key in user_keys():
        assert out.index(f"  {key} = ") < more, key
    assert out.index("  num-directions = ") > more


# ---- progress and error summary (from log lines) ----------------------------------------

LOG = """\
\x1b[92mINFO \x1b[0m:      Federation `@none/default` (2 simulated SuperNodes)
\x1b[92mINFO \x1b[0m:      Identify: Replies from 2 of 2 nodes: accepted 11, 12; rejected or missing none
\x1b[92mINFO \x1b[0m:      [ROUND 1/2]
\x1b[92mINFO \x1b[0m:      Round 1: Replies from 1 of 2 nodes: accepted 11 ('site-a'); rejected or missing 12 ('site-b')
\x1b[93mWARNING \x1b[0m:   Round 1: Rejected reply from node 12 ('site-b'): client error 2: <class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()
Traceback (most recent call last):
  File "x.py", line 1, in f
ValueError: node data is broken
Exception ClientAppException occurred. Message: node data is broken'>
2026-11-26T05:56:48.948Z INFO [uvicorn.access] 127.0.0.1:32918 - "POST /v1/control/start-run HTTP/1.1" 200
\x1b[91mERROR \x1b[0m:     Simulation raised an exception
Traceback (most recent call last):
  File "server.py", line 130, in run_server
    raise NotEnoughRepliesError(
gems_fl.protocol.replies.NotEnoughRepliesError: only 1 of 2 nodes replied; min-replies=2. Rejected: node 12: client error 2: <class 'x'>
  File "x.py", line 1, in f
ValueError: node data is broken
\x1b[91mERROR \x1b[0m:     Exit Code: 700
"""


def test_error_summary_server_then_each_node_error_once():
    errors = [e.line() for e in summarise_errors(LOG.splitlines(True))]
    assert errors == [
        "  server: NotEnoughRepliesError: only 1 of 2 nodes replied; min-replies=2. (rejections below)",
        "  1 node (site-b): node data is broken",
    ]


def test_progress_phases_as_plain_lines():
    out = io.StringIO()
    progress = Progress(stream=out, live=False)
    for line in LOG.splitlines(True):
        progress.feed(line)
    text = out.getvalue()
    assert "identity check: waiting for 2 nodes" in text
    assert "identity check: 2 of 2 nodes replied" in text
    assert "round 1/2: 1 of 2 nodes replied" in text


def test_a_piped_log_carries_no_colour_codes(tmp_path, capsys):
    """Flower colours its log levels and Ray its actors' prefixes; a log that goes to a
    file or a pipe shows the words only, and so does the kept log file."""
    from gems_fl.running.runlog import RunLog

    coloured = "\x1b[92mINFO \x1b[0m:      Sites: completed with 2 of 2 sites\n"
    out = io.StringIO()
    Progress(stream=out, live=False).echo(coloured)
    assert out.getvalue() == "INFO :      Sites: completed with 2 of 2 sites\n"
    log = RunLog(tmp_path / "run.log", None, verbose=True)
    log.add(coloured)
    log.close()
    assert capsys.readouterr().out == "INFO :      Sites: completed with 2 of 2 sites\n"
    assert (tmp_path / "run.log").read_text() == "INFO :      Sites: completed with 2 of 2 sites\n"


STOPPED = """\
\x1b[91mERROR \x1b[0m:     Sites: stopped before training: expected every site present
\x1b[91mERROR \x1b[0m:     Simulation raised an exception
Traceback (most recent call last):
  File "finish.py", line 64, in stop_before_training
    raise RequiredNodesMissing(f"{line} (nothing trained")
gems_fl.protocol.attendance.RequiredNodesMissing: stopped before training: expected every site
\x1b[91mERROR \x1b[0m:     Exit Code: 700

An unhandled exception occurred when running the simulation.

For more information, visit: <https://flower.ai/docs/framework/1.42/en/ref-exit-codes/700.html>
\x1b[92mINFO \x1b[0m:      after the run
"""


def test_a_deliberate_stop_shows_its_reason_without_flowers_crash_report(tmp_path, capsys):
    """The ServerApp raises on purpose after writing its results (a required site is
    missing): the display keeps its reason line, not a traceback and Flower's exit
    notes; the kept log has every line; a real crash is shown whole."""
    from gems_fl.running.runlog import ANSI, RunLog

    log = RunLog(tmp_path / "run.log", None, verbose=True)
    for line in STOPPED.splitlines(True):
        log.add(line)
    log.close()
    shown = capsys.readouterr().out
    assert shown == ("ERROR :     Sites: stopped before training: expected every site present\n"
                     "INFO :      after the run\n")
    assert (tmp_path / "run.log").read_text() == ANSI.sub("", STOPPED)
    crash = LOG.split("2026-11-26")[0] + LOG.split("200\n")[1]
    log = RunLog(tmp_path / "crash.log", None, verbose=True)
    for line in crash.splitlines(True):
        log.add(line)
    log.close()
    shown = capsys.readouterr().out
    assert "Traceback" in shown and "NotEnoughRepliesError: only 1 of 2" in shown
    assert shown.count("\n") == crash.count("\n")


def test_a_ray_workers_crash_report_at_shutdown_stays_in_the_log_file(tmp_path, capsys):
    """Flower's Ray backend exits its actors and shuts Ray down without waiting; an actor's
    crash report then (after the results were written) is kept in the log file and shown
    as one line; the same lines before the results are shown as they are."""
    from gems_fl.running.runlog import RAY_SHUTDOWN_NOTE, RunLog

    crash = ("(ClientAppActor pid=4242) terminate called without an active exception\n"
             "(ClientAppActor pid=4242) Fatal Python error: Aborted\n"
             "(ClientAppActor pid=4242) \n"
             "(ClientAppActor pid=4242) Thread 0x00007f00 (most recent call first):\n"
             '(ClientAppActor pid=4242)   File "/x/ray/_private/worker.py", line 9 in main_loop\n'
             "(raylet) A worker died or was killed while executing a task\n")
    text = ("INFO :      Results written to /tmp/out/run-1/results.json (model: m)\n" + crash
            + "INFO :      Sites: completed with 2 of 2 sites\n")
    log = RunLog(tmp_path / "run.log", None, verbose=True)
    for line in text.splitlines(True):
        log.add(line)
    log.close()
    shown = capsys.readouterr().out
    assert shown == ("INFO :      Results written to /tmp/out/run-1/results.json (model: m)\n"
                     + RAY_SHUTDOWN_NOTE + "\nINFO :      Sites: completed with 2 of 2 sites\n")
    assert (tmp_path / "run.log").read_text() == text
    log = RunLog(tmp_path / "early.log", None)
    for line in crash.splitlines(True):
        log.add(line)
    log.close()
    assert "Fatal Python error: Aborted" in capsys.readouterr().out


def test_flowers_final_results_dump_stays_in_the_log_file(tmp_path, capsys):
    from gems_fl.running.runlog import RunLog

    dump = ("INFO :      Strategy execution finished in 14.12s\n"
            "INFO :      Final results:\n"
            "INFO :      \n"
            "INFO :      \tGlobal Arrays:\n"
            "INFO :      \t\tArrayRecord (0.005 MB)\n"
            "INFO :      \tAggregated ClientApp-side Evaluate Metrics:\n"
            "INFO :      \t{}\n"
            "INFO :      \n"
            "INFO :      Verify: h_G is good enough on 2 of 2 nodes\n")
    log = RunLog(tmp_path / "run.log", None, verbose=True)
    for line in dump.splitlines(True):
        log.add(line)
    log.close()
    assert capsys.readouterr().out == ("INFO :      Strategy execution finished in 14.12s\n"
                                       "INFO :      Verify: h_G is good enough on 2 of 2 nodes\n")
    assert (tmp_path / "run.log").read_text() == dump


def test_a_node_error_reason_is_the_message_the_node_raised():
    """Flower wraps a ClientApp's exception (under Ray with the node's whole traceback
    and colour codes); what the server logs and records is the node's own message."""
    from gems_fl.protocol.replies import node_error_message

    ray = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor"
           ".run()\x1b[39m (pid=1)\n  File \"x.py\", line 1\nValueError: bad labels\n\n"
           "flwr.clientapp.client_app.ClientAppException: \nException ClientAppException "
           "occurred. Message: IDX file 'a': expected labels in 0..9, found 12.'>")
    assert node_error_message(ray) == "IDX file 'a': expected labels in 0..9, found 12."
    assert node_error_message("<class 'ValueError'>:<'no rows'>") == "ValueError: no rows"
    assert node_error_message("something else") == "something else"


# ---- results.json -----------------------------------------------------------------------


def test_results_metadata_sorted_nodes_and_named_per_node_values(tmp_path):
    results = run_in_process(3, tmp_path, **{"label-division": "paper"})
    saved = json.loads((tmp_path / "run-1" / RESULTS_FILE).read_text())
    run = saved["run"]
    assert run["started_at"].endswith("Z") and run["finished_at"] >= run["started_at"]
    assert set(run["versions"]) == {"gems-fl", "flwr", "torch", "numpy", "scikit-learn", "python"}
    assert all(run["versions"].values())
    assert run["cores"] >= 1 and "git_commit" in run
    names = [n["name"] for n in saved["nodes"]]
    assert names == sorted(names) == ["partition-0", "partition-1", "partition-2"]
    assert sorted(saved["rows"]["Local"]["per_node"]) == names
    assert sorted(saved["intersection"]["inside"]) == names
    assert results["rows"]["Local"]["per_node"] == saved["rows"]["Local"]["per_node"]


def test_interrupted_results_write_leaves_no_folder(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(KeyboardInterrupt):
        write_results({"status": "completed"}, tmp_path / "run-7", {"w": np.zeros(2)})
    assert list(tmp_path.iterdir()) == []


def test_results_rewrite_replaces_an_existing_folder(tmp_path):
    write_results({"status": "old"}, tmp_path / "run-1", None)
    path = write_results({"status": "new"}, tmp_path / "run-1", {"w": np.ones(2)})
    assert json.loads(path.read_text())["status"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-1"]


# ---- real processes ----------------------------------------------------------------------


class Launched:
    """`python -m gems_fl.running.cli run ...` with a marker of our own in its environment."""

    def __init__(self, tmp_path: Path, args: list[str]) -> None:
        self.marker = uuid.uuid4().hex
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(self.tmp),
               "GEMS_FL_TEST_MARKER": self.marker}
        self.proc = subprocess.Popen([sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT),
                                      *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [threading.Thread(target=self._read, args=(s, sink), daemon=True)
                        for s, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(stream, sink) -> None:
        for line in stream:
            sink.append(line)

    def survivors(self) -> list[int]:
        return marked_processes(self.marker, "GEMS_FL_TEST_MARKER")

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=5)
        return code


RAY_AGENT_TITLES = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")
RAY_AGENT_SCRIPTS = (b"/ray/dashboard/agent.py", b"/ray/_private/runtime_env/agent/main.py")


def _ray_agents() -> set[int]:
    """PIDs of Ray's agents, by the title Ray gives them (their environ then no longer shows
    any marker) or, before or without that retitling, by the script they run."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args[0].startswith(RAY_AGENT_TITLES) or any(a.endswith(RAY_AGENT_SCRIPTS)
                                                        for a in args[1:3]):
            found.add(int(entry.name))
    return found


def _ray_folders(run: Launched) -> list[Path]:
    """The Ray folders (``RAY_TMPDIR``) in the environments of the run's marked processes."""
    folders = set()
    for pid in run.survivors():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        folders.update(Path(item.split(b"=", 1)[1].decode()) for item in environ
                       if item.startswith(b"RAY_TMPDIR="))
    return sorted(folders)


def _agents_of(folders: list[Path]) -> set[int]:
    """The run's own Ray agents: those holding files in its Ray folders. Other tests may
    run Ray beside this one (``pytest -n``), so Ray's agents at large are not the run's."""
    return _ray_agents() & set(processes_using(folders)) if folders else set()


def _ray_processes() -> list[str]:
    """Command lines of every process of Ray's now (for a failure's message)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ray" in line.split(" ")[0] or "/ray/" in line:
            found.append(f"{entry.name}: {line[:160]}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_everything_the_run_started(tmp_path, sig):
    """Signalled once Ray's agents run (the run cannot finish first: its nodes train for
    100,000 epochs), the launcher leaves no process behind, Ray's agents included."""
    out = tmp_path / "out"
    run = Launched(tmp_path, ["--nodes", "3", "--output-dir", str(out), "--run-config",
                              "local-max-epochs=100000 local-patience=100000"])
    # Ray's agents appear in ~15 s on an idle machine; the limit only stops a hung run, and
    # what the run printed and what Ray started say why if it is reached.
    deadline = time.monotonic() + 900
    while not (agents := _agents_of(folders := _ray_folders(run))):
        assert run.proc.poll() is None, "".join(run.out + run.err)
        assert time.monotonic() < deadline, ("Ray's agents did not start; Ray's processes: "
                                             f"{_ray_processes()}\n" + "".join(run.err[-40:]))
        time.sleep(0.2)
    assert len(run.survivors()) >= 3  # SuperLink, SuperExec, flwr, ...
    os.kill(run.proc.pid, sig)
    code = run.wait(timeout=60)
    assert code == 128 + sig, "".join(run.err)
    last = run.err[-1]
    assert f"interrupted by {signal.Signals(sig).name}" in last and "stopped the SuperLink" in last
    assert run.survivors() == []
    assert _ray_agents() & agents == set()  # by PID: the agents no longer carry the marker
    assert processes_using(folders) == []  # nothing Ray started holds the run's files
    assert [p.name for p in run.tmp.iterdir() if p.name.startswith(("gems-fl", "ray"))] == []
    assert list(out.glob(f"run-*/{RESULTS_FILE}")) == [] and list(out.glob(".run-*")) == []


@pytest.mark.slow
def test_a_node_side_error_is_the_last_thing_printed(tmp_path):
    """With required-nodes=0 nothing stops the run before training: it fails for want of
    replies (exit 1), and the nodes' own error is the summary's last line."""
    data = write_mnist_like(tmp_path / "data", bad_label=True)
    run = Launched(tmp_path, ["--nodes", "2", "--output-dir", str(tmp_path / "out"), "--run-config",
                              f"dataset='mnist' data-dir='{data}' required-nodes=0 {FAST}"])
    assert run.wait(timeout=400) == 1
    err = [line.rstrip("\n") for line in run.err if line.strip()]
    assert err[-1].startswith("gems-fl: full log: ")
    assert Path(err[-1].removeprefix("gems-fl: full log: ")).is_file()
    node_lines = [line for line in err if line.startswith("  2 nodes (")]
    assert len(node_lines) == 1 and "expected labels in 0..9" in node_lines[0]
    assert err[-2] == node_lines[0]
    assert not any("uvicorn" in line or "HTTP/1.1" in line for line in err)
    assert run.survivors() == []


def test_launch_timing_adds_startup_and_shutdown_to_the_results(tmp_path):
    from gems_fl.running.timing import add_launch_timing, timing_line

    path = tmp_path / "results.json"
    path.write_text(json.dumps({"started_unix": 1000.0,
                                "timing_s": {"identify": 2.0, "rounds": 30.0, "total": 50.0}}))
    results = add_launch_timing(path, launched_unix=988.0, ended_unix=1053.0)
    assert results["timing_s"] == {"identify": 2.0, "rounds": 30.0, "total": 50.0,
                                   "startup": 12.0, "shutdown": 3.0, "wall": 65.0}
    assert json.loads(path.read_text()) == results
    assert timing_line(results["timing_s"]) == ("start-up 12.0 s, identify round 2.0 s, GEMS "
                                                "rounds 30.0 s, shut-down 3.0 s; 65.0 s in all")


@pytest.mark.slow
def test_the_nodes_run_on_an_existing_ray_cluster(tmp_path):
    """`gems-fl run --ray-address` runs the simulation on a Ray head started here on
    loopback (the run is a job of that cluster, and starts no Ray of its own); stopping
    the head afterwards leaves nothing running."""
    from gems_fl.running.superlink import free_port

    port = free_port()
    ray_tmp = Path(tempfile.mkdtemp(prefix="gems-ray-", dir="/tmp"))  # Ray's socket paths are short
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    head = subprocess.Popen(["ray", "start", "--head", "--block", "--port", str(port),
                             "--num-cpus", "2", "--include-dashboard=false",
                             "--disable-usage-stats"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(120):  # the head's GCS accepts connections: a state, polled
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                assert head.poll() is None, "ray start --head exited"
                time.sleep(0.5)
        out = tmp_path / "out"
        run = Launched(tmp_path, ["--nodes", "2", "--output-dir", str(out),
                                  "--ray-address", f"127.0.0.1:{port}"])
        assert run.wait(timeout=600) == 0, "".join(run.err[-40:])
        (path,) = out.glob(f"run-*/{RESULTS_FILE}")
        assert json.loads(path.read_text())["status"] == "completed"
        jobs = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address='127.0.0.1:{port}', "
             "logging_level='ERROR'); print(len(ray._private.state.jobs()))"],
            env=env, capture_output=True, text=True, timeout=120, check=False)
        assert int(jobs.stdout.strip().splitlines()[-1]) >= 2  # the run's driver and this one
        assert run.survivors() == []
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
    for _ in range(60):
        if not processes_using([ray_tmp]):
            break
        time.sleep(0.5)
    assert processes_using([ray_tmp]) == []
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_ray_address_nobody_answers_is_refused_before_anything_starts(capsys):
    from gems_fl.running.cli import main
    from gems_fl.running.superlink import free_port

    assert main(["run", "--nodes", "2", "--ray-address", f"127.0.0.1:{free_port()}"]) == 2
    assert "no Ray head answers there" in capsys.readouterr().err
    assert main(["run", "--nodes", "2", "--ray-address", "nowhere"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_flower_is_found_beside_the_interpreter_without_an_activated_environment():
    """``gems-fl submit``/``status`` and the launcher call Flower's executables of the
    Python running them, also when its folder is not on PATH (a virtual environment used
    as ``.venv/bin/gems-fl`` without ``activate``)."""
    code = ("from gems_fl.running.processes import flower_tool, with_flower_on_path\n"
            "import os, pathlib\n"
            "tool = flower_tool('flwr')\n"
            "assert os.path.isabs(tool) and os.access(tool, os.X_OK), tool\n"
            "env = with_flower_on_path({'PATH': '/nonexistent'})\n"
            "assert env['PATH'].split(os.pathsep)[0] == str(pathlib.Path(tool).parent), env\n"
            "from gems_fl.running.submit import Connection\n"
            "Connection('x').flwr('--version')  # FileNotFoundError without it\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PATH": "/nonexistent"},
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- the app the package carries ---------------------------------------------------------


def test_the_packaged_app_has_the_checkouts_settings_and_is_a_valid_flower_app(tmp_path):
    import tomllib

    from flwr.common.config import validate_config

    from gems_fl.running.packaged_app import is_flower_app, packaged_app

    folder = packaged_app(tmp_path / "app")
    config = tomllib.loads((folder / "pyproject.toml").read_text())
    assert config["tool"]["flwr"]["app"]["config"] == app_defaults()
    valid, errors, _ = validate_config(config, check_module=False)
    assert valid, errors
    assert is_flower_app(folder) and is_flower_app(ROOT) and not is_flower_app(tmp_path)


def test_the_app_folder_is_the_checkout_inside_one_and_the_packaged_app_elsewhere(
        tmp_path, monkeypatch):
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.supercore.object_ref import load_app

    from gems_fl.running.packaged_app import COMPONENTS, resolve_app

    monkeypatch.chdir(ROOT)
    assert resolve_app(None) == (ROOT, False)
    monkeypatch.chdir(tmp_path)
    folder, packaged = resolve_app(None)
    assert packaged and (folder / "pyproject.toml").is_file()
    assert resolve_app(str(ROOT)) == (ROOT, False)
    assert isinstance(load_app(COMPONENTS["serverapp"], ValueError), ServerApp)
    assert isinstance(load_app(COMPONENTS["clientapp"], ValueError), ClientApp)


@pytest.mark.slow
def test_gems_fl_run_works_from_an_empty_folder(tmp_path):
    """A user's own folder holds no Flower app: `gems-fl run` runs the app the package
    carries, and the results land in that folder."""
    folder = tmp_path / "mine"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "run", "--nodes", "2",
                           "--run-config", FAST], cwd=folder, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert list((folder / "gems-results").glob("run-*/results.json"))
