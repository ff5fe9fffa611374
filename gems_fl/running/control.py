"""The SuperLink's Control API asked from this process: what ``flwr supernode ls``, ``flwr
ls`` and ``flwr log --show`` ask, over one connection, without a ``flwr`` process per
question (each costs about 2 s to start), and with what those commands leave out of their
JSON: the name a SuperNode was registered under (``flwr supernode register --name``).

The connection is read from Flower's own config (``$FLWR_HOME/config.toml``,
``[superlink.<name>]``) by Flower's own code, so TLS and account login work as for ``flwr``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gems_fl.running.outcome import RunFailed

#: A registered SuperNode's status once its registration is withdrawn: it is no longer
#: expected (``flwr supernode unregister``).
UNREGISTERED = "unregistered"


@dataclass(frozen=True)
class LinkNode:
    """A SuperNode the SuperLink knows: its id, registered name ('' if none) and status
    (``registered``: never connected; ``online``; ``offline``; ``unregistered``)."""

    node_id: int
    name: str
    status: str


@dataclass(frozen=True)
class LinkRun:
    """A run on the SuperLink: its id and status (``finished:completed``, ``running``, ...)."""

    run_id: int
    status: str


class ControlLink:
    """One Control API connection to the SuperLink named ``connection`` in Flower's config.
    Use as a context manager; every call raises :class:`RunFailed` with Flower's words if
    the SuperLink cannot be asked."""

    def __init__(self, connection: str, flwr_home: str | None = None) -> None:
        self.connection = connection
        self.flwr_home = flwr_home  # Flower's config folder, if not $FLWR_HOME's
        self._client: Any = None

    def __enter__(self) -> ControlLink:
        previous = os.environ.get("FLWR_HOME")
        try:
            from flwr.cli.flower_config import read_superlink_connection
            from flwr.cli.utils import init_http_client_from_connection

            if self.flwr_home:
                os.environ["FLWR_HOME"] = self.flwr_home
            self._client = init_http_client_from_connection(read_superlink_connection(self.connection))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - typer exits, config errors: one message
            raise RunFailed(f"cannot reach the SuperLink '{self.connection}': {_words(exc)}") from None
        finally:
            if self.flwr_home and previous is None:
                os.environ.pop("FLWR_HOME", None)
            elif self.flwr_home:
                os.environ["FLWR_HOME"] = previous
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()

    def _ask(self, what: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - grpc and HTTP errors alike: one message
            raise RunFailed(f"the SuperLink '{self.connection}' did not answer {what}: "
                            f"{_words(exc)}") from None

    def nodes(self) -> list[LinkNode]:
        """Every SuperNode the SuperLink lists, by id."""
        from flwr.proto.control_pb2 import ListNodesRequest

        res = self._ask("ListNodes", lambda: self._client.ListNodes(ListNodesRequest()))
        return sorted((LinkNode(int(n.node_id), str(n.name), str(n.status)) for n in res.nodes_info),
                      key=lambda n: n.node_id)

    def runs(self, run_id: int | None = None) -> list[LinkRun]:
        """Every run on the SuperLink, by id (``run_id``: that run only, if it exists)."""
        from flwr.proto.control_pb2 import ListRunsRequest

        request = ListRunsRequest() if run_id is None else ListRunsRequest(run_id=run_id)
        res = self._ask("ListRuns", lambda: self._client.ListRuns(request))
        out = []
        for run_id, run in res.run_dict.items():
            status = run.status.status + (f":{run.status.sub_status}" if run.status.sub_status else "")
            out.append(LinkRun(int(run_id), status))
        return sorted(out, key=lambda r: r.run_id)

    def log(self, run_id: int) -> str:
        """The run's log so far (``flwr log RUN_ID --show``)."""
        from flwr.proto.control_pb2 import StreamLogsRequest

        def first_part() -> str:
            for res in self._client.StreamLogs(StreamLogsRequest(run_id=run_id, after_timestamp=0.0)):
                return str(res.log_output)
            return ""

        return self._ask(f"StreamLogs for run {run_id}", first_part)


def registered_names(nodes: list[LinkNode]) -> list[str]:
    """The names the operator registered SuperNodes under (SuperNode authentication:
    ``flwr supernode register KEY LINK --name NAME``), withdrawn registrations left out.
    Without authentication SuperNodes register themselves, nameless, and this is empty."""
    return sorted({n.name for n in nodes if n.name and n.status != UNREGISTERED})


def _words(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "message", "") or exc).split())
    return text[-300:] or type(exc).__name__
