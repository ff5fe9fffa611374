"""A real Flower deployment on this machine: a TLS SuperLink and separate SuperNodes.

The same processes and flags an operator starts on separate machines (see
``deploy/README.md``), started here on loopback addresses: ``flower-superlink`` with
the certificate from ``deploy/make-certs.sh``, one ``flower-supernode`` per node with
the CA certificate and its own ``--node-config``, and ``flwr run`` through a connection
entry with ``root-certificates``. Tests and ``deploy/measure.py`` use it. Every
process runs in its own process group and :meth:`TlsFederation.stop` ends each group
by the PID it started, also when the caller fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from gems_fl.evaluation.run_files import RESULTS_FILE
from gems_fl.running.outcome import RunFailed
from gems_fl.running.processes import flower_tool, with_flower_on_path
from gems_fl.running.superlink import free_port, run_status
from gems_fl.settings import lab_keys
from gems_fl.settings.lab import fold_lab

ROOT = Path(__file__).resolve().parents[2]
MAKE_CERTS = ROOT / "deploy" / "make-certs.sh"
CONNECTION = "gems-tls"
START_TIMEOUT_S = 60.0


@dataclass
class Certs:
    """Paths written by ``deploy/make-certs.sh``."""

    ca: Path
    cert: Path
    key: Path


def make_certs(folder: Path, *names: str) -> Certs:
    """Run ``deploy/make-certs.sh folder names...`` (a CA and a SuperLink certificate)."""
    if not MAKE_CERTS.is_file():
        raise FileNotFoundError(f"{MAKE_CERTS} is missing; run from a checkout of gems-fl")
    proc = subprocess.run(["bash", str(MAKE_CERTS), str(folder), *(names or ("127.0.0.1",))],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"make-certs.sh failed ({proc.returncode}): {proc.stderr.strip()}")
    return Certs(folder / "ca.crt", folder / "server.crt", folder / "server.key")


def make_node_key(path: Path) -> Path:
    """An EC (SECP384R1) key pair for SuperNode authentication, in OpenSSH format.

    Writes ``path`` (private, for ``--auth-supernode-private-key``) and ``path.pub``
    (for ``flwr supernode register``); the same as
    ``ssh-keygen -t ecdsa -b 384 -N "" -f path``. Returns the public key's path.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    public = path.with_name(path.name + ".pub")
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return public


def stop_group(process: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL, the process group led by ``process`` (started by us).

    If the leader has already exited, what is left of its group (e.g. a SuperNode's
    SuperExec) gets SIGKILL.
    """
    if process is None:
        return
    if process.poll() is not None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class SuperNode:
    """One started ``flower-supernode``."""

    name: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        """The SuperNode's log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class DeployedRun:
    """A finished ``flwr run`` on the federation."""

    run_id: int
    status: str
    output: str
    wall_s: float
    results: dict[str, Any] | None = None
    results_path: Path | None = None


@dataclass
class TlsFederation:
    """A TLS SuperLink plus SuperNodes, each its own process (group), on loopback."""

    workdir: Path
    certs: Certs | None = None
    supernode_auth: bool = False
    nodes: list[SuperNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.certs is None:
            self.certs = make_certs(self.workdir / "certs", "127.0.0.1", "localhost")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(exist_ok=True)
        (self.home / "config.toml").write_text(tomli_w.dumps({"superlink": {
            "default": CONNECTION,
            CONNECTION: {"address": self.address, "root-certificates": str(self.certs.ca)},
        }}))
        self.env = {**with_flower_on_path(dict(os.environ)), "FLWR_HOME": str(self.home),
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        self.superlink: subprocess.Popen | None = None
        self.superlink_log = self.workdir / "superlink.log"

    def __enter__(self) -> TlsFederation:
        try:
            self.start_superlink()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        with log_path.open("wb") as log:
            return subprocess.Popen(cmd, env=env or self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_superlink(self) -> None:
        """``flower-superlink`` with TLS on a free port; wait until it answers."""
        assert self.certs is not None
        self.superlink = self._spawn(
            [flower_tool("flower-superlink"), "--ssl-ca-certfile", str(self.certs.ca),
             "--ssl-certfile", str(self.certs.cert), "--ssl-keyfile", str(self.certs.key),
             "--host", "127.0.0.1", "--port", str(self.port),
             "--disable-runtime-dependency-installation",
             *(["--enable-supernode-auth"] if self.supernode_auth else [])], self.superlink_log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                raise RunFailed(f"flower-superlink exited with {self.superlink.returncode}:\n"
                                f"{self.superlink_log.read_text(errors='replace')[-3000:]}")
            try:
                context = ssl.create_default_context(cafile=str(self.certs.ca))
                if httpx.get(f"https://{self.address}/health", verify=context,
                             timeout=1.0).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RunFailed(f"flower-superlink did not answer on https://{self.address} in "
                        f"{START_TIMEOUT_S:.0f}s")

    def register(self, public_key: Path, name: str) -> subprocess.CompletedProcess[str]:
        """``flwr supernode register`` a SuperNode's public key (SuperNode auth)."""
        return self.flwr("supernode", "register", str(public_key), CONNECTION, "--name", name)

    def add_node(self, node_config: dict[str, Any], *, ca: Path | None = None,
                 wait: bool = True, extra_args: tuple[str, ...] = ()) -> SuperNode:
        """Start a ``flower-supernode`` with this node config (and, by default, the CA).

        With ``wait`` it returns once the SuperLink accepted the node (its log shows
        its SuperNode ID).
        """
        assert self.certs is not None
        config = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}"
                          for k, v in node_config.items())
        name = str(node_config.get("node-name", f"node-{len(self.nodes)}"))
        log_path = self.workdir / f"supernode-{len(self.nodes)}-{name}.log"
        process = self._spawn(
            [flower_tool("flower-supernode"), "--root-certificates", str(ca or self.certs.ca),
             "--superlink", self.address, "--port", str(free_port()),
             "--node-config", config, *extra_args], log_path)
        node = SuperNode(name, process, log_path)
        self.nodes.append(node)
        if wait:
            self.wait_for_log(node, "SuperNode ID:", START_TIMEOUT_S)
        return node

    def wait_for_log(self, node: SuperNode, text: str, timeout: float) -> None:
        """Block until ``text`` appears in the node's log; fail if the node exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in node.log():
                return
            if node.process.poll() is not None:
                raise RunFailed(f"SuperNode {node.name} exited with {node.process.returncode} "
                                f"before '{text}':\n{node.log()[-3000:]}")
            time.sleep(0.1)
        raise RunFailed(f"SuperNode {node.name}: no '{text}' in its log after {timeout:.0f}s")

    def kill_node(self, node: SuperNode) -> None:
        """Kill a SuperNode and its ClientApp processes at once (SIGKILL to its group)."""
        try:
            os.killpg(node.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.process.wait(timeout=10)

    def flwr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``flwr`` CLI command through the TLS connection entry."""
        return subprocess.run([flower_tool("flwr"), *args], env=self.env, capture_output=True, text=True,
                              check=False)

    def run(self, app_dir: Path, run_config: dict[str, Any], timeout: float = 600.0) -> DeployedRun:
        """``flwr run app gems-tls --stream``; the run's status comes from the SuperLink.
        ``run_config`` may name research switches as keys: they travel in ``lab``.

        ``flwr run`` exits 0 whatever the outcome, so the status is read with
        ``flwr ls --run-id``; the results file is loaded when the run completed.
        """
        overrides = self.workdir / f"run-config-{time.monotonic_ns()}.toml"
        overrides.write_text(tomli_w.dumps(fold_lab(run_config, lab_keys())))
        t0 = time.perf_counter()
        proc = subprocess.Popen([flower_tool("flwr"), "run", str(app_dir), CONNECTION, "--stream",
                                 "--run-config", str(overrides)], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise RunFailed(f"`flwr run` did not return within {timeout:.0f}s") from None
        wall = time.perf_counter() - t0
        match = re.search(r"Successfully started run (\d+)", output)
        if not match:
            raise RunFailed(f"`flwr run` did not start a run:\n{output[-3000:]}")
        run_id = int(match.group(1))
        status = run_status(self, run_id)
        run = DeployedRun(run_id, status, output, wall)
        path = Path(run_config.get("output-dir", "")) / f"run-{run_id}" / RESULTS_FILE
        if status.startswith("finished") and path.is_file():  # also an incomplete run's
            run.results_path = path
            run.results = json.loads(path.read_text())
        return run

    def stop(self) -> None:
        """Stop every SuperNode, then the SuperLink (each process group, by its PID)."""
        for node in self.nodes:
            stop_group(node.process)
        stop_group(self.superlink)
