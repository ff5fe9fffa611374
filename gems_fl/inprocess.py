"""An in-process :class:`~flwr.serverapp.Grid`: the real ClientApp, no SuperLink.

Tests and the reproduction harness drive the very same ``ServerApp`` and ``ClientApp``
code as ``flwr run``, only the transport differs: each message is handed to the
ClientApp in this process, with a per-node :class:`~flwr.app.Context` like the one the
simulation engine builds (``partition-id``, ``num-partitions``). An exception in the
ClientApp becomes an error reply, as it does under Flower.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from gems_fl.layerwise import content_bytes

ReplyHook = Callable[[Message], Message]


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process.

    Parameters
    ----------
    client_app : ClientApp
        The app every node runs.
    num_nodes : int
        Number of nodes; node ``k`` gets ``partition-id=k``.
    run_config : dict
        The run config every node's Context sees.
    reply_hook : callable, optional
        Applied to each reply before the server sees it (tests use it to corrupt one).
    node_configs : list of dict, optional
        Extra node config per node (e.g. a node's own ``eps``), merged over the
        partition keys.

    Attributes
    ----------
    exchanges : list of dict
        One entry per ``send_and_receive`` call (one round): ``down`` and ``up``, the
        bytes of the records sent to and received from the nodes, counted as Flower's
        ``count_bytes`` does, and ``nodes``, the number of messages sent.
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict,
        *,
        run_id: int = 1,
        reply_hook: ReplyHook | None = None,
        node_configs: list[dict] | None = None,
    ) -> None:
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError(f"node_configs has {len(node_configs)} entries for {num_nodes} nodes")
        self._app = client_app
        self._run_id = run_id
        self._hook = reply_hook
        self._contexts = {
            1000 + k: Context(
                run_id=run_id, node_id=1000 + k,
                node_config={"partition-id": k, "num-partitions": num_nodes,
                             **(node_configs[k] if node_configs else {})},
                state=RecordDict(), run_config=dict(run_config),
            )
            for k in range(num_nodes)
        }
        self._replies: dict[str, Message] = {}
        self._run = None
        self.exchanges: list[dict[str, int]] = []
        self._down = self._up = self._sent = 0
        # Flower's ServerApp runtime sets these before user code creates a Message.
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    def set_run(self, run) -> None:  # noqa: ANN001 - flwr's Run type is internal
        self._run = run

    @property
    def run(self):  # noqa: ANN201
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content=content, message_type=message_type,
                       dst_node_id=dst_node_id, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            # The SuperLink assigns message ids; Metadata offers no public setter.
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            msg.metadata.__dict__["_run_id"] = self._run_id
            self._down += content_bytes(msg.content)
            self._sent += 1
            ids.append(msg.metadata.message_id)
            self._replies[msg.metadata.message_id] = self._deliver(msg)
        return ids

    def _deliver(self, msg: Message) -> Message:
        try:
            reply = self._app(msg, self._contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - becomes an error reply, as in Flower
            reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
        return self._hook(reply) if self._hook else reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = [self._replies.pop(mid) for mid in message_ids if mid in self._replies]
        self._up += sum(content_bytes(r.content) for r in replies if r.has_content())
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self._down = self._up = self._sent = 0
        replies = self.pull_messages(self.push_messages(messages))
        self.exchanges.append({"down": self._down, "up": self._up, "nodes": self._sent})
        return replies
