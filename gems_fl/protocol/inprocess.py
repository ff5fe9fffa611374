"""An in-process :class:`~flwr.serverapp.Grid`: the real ClientApp, no SuperLink.

Tests and the reproduction harness drive the very same ``ServerApp`` and ``ClientApp``
code as ``flwr run``, only the transport differs: each message is handed to the
ClientApp in this process, with a per-node :class:`~flwr.app.Context` like the one the
simulation engine builds (``partition-id``, ``num-partitions``). An exception in the
ClientApp becomes an error reply, as it does under Flower. Replies come back in node-id
order, so a run's result does not depend on the order a strategy sampled the nodes in.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from gems_fl.protocol.node_store import NodeStore
from gems_fl.protocol.wire import content_bytes

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
        Applied to each ``train`` reply before the server sees it (tests use it to
        corrupt one); the replies to the server's identity ``query`` pass untouched.
    evaluate_hook : callable, optional
        The same for ``evaluate`` replies; returning None drops the reply, as if the
        node never answered.
    node_configs : list of dict, optional
        One node config per node (e.g. ``data-path`` and ``node-name``, as a
        SuperNode's ``--node-config``) instead of ``partition-id``/``num-partitions``.
    in_memory : bool
        The nodes keep what they keep between rounds in memory, never in a file
        (:meth:`NodeStore.in_memory_only`): a fit that writes nothing.
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
        evaluate_hook: Callable[[Message], Message | None] | None = None,
        in_memory: bool = False,
    ) -> None:
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError(f"node_configs has {len(node_configs)} entries for {num_nodes} nodes")
        self._app = client_app
        self._run_id = run_id
        self._hook = reply_hook
        self._evaluate_hook = evaluate_hook
        self._contexts = {
            1000 + k: Context(
                run_id=run_id, node_id=1000 + k,
                node_config=(dict(node_configs[k]) if node_configs is not None
                             else {"partition-id": k, "num-partitions": num_nodes}),
                state=RecordDict(), run_config=dict(run_config),
            )
            for k in range(num_nodes)
        }
        if in_memory:
            for context in self._contexts.values():
                NodeStore.in_memory_only(context)
        self._replies: dict[str, Message] = {}
        self._run = None
        self.exchanges: list[dict[str, int]] = []
        self._down = self._up = self._sent = 0
        # Flower's ServerApp runtime sets these before user code creates a Message.
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
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
            self._type = msg.metadata.message_type
            ids.append(msg.metadata.message_id)
            reply = self._deliver(msg)
            if reply is not None:  # None: the node never answers (a test's hook said so)
                self._replies[msg.metadata.message_id] = reply
        return ids

    def _deliver(self, msg: Message) -> Message:
        try:
            # each node gets its own copy, as over the wire: a node's code may change the
            # content it receives (secaggplus_mod pops its stage), and one content object
            # is often shared by every node's message
            reply = self._app(copy.deepcopy(msg), self._contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - becomes an error reply, as in Flower
            reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
        if self._hook and msg.metadata.message_type == MessageType.TRAIN:
            return self._hook(reply)
        if self._evaluate_hook and msg.metadata.message_type == MessageType.EVALUATE:
            return self._evaluate_hook(reply)
        return reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = [self._replies.pop(mid) for mid in message_ids if mid in self._replies]
        # In node order, not in the order the messages went out: Flower's strategies sample
        # nodes with the global `random` and sum the replies in the order they come, so a
        # float sum would otherwise depend on whatever drew from `random` before the run.
        replies.sort(key=lambda r: r.metadata.src_node_id)
        self._up += sum(content_bytes(r.content) for r in replies if r.has_content())
        return replies

    def forget_node_files(self) -> None:
        """Remove the files each node kept for the run (:class:`NodeStore`): a node
        removes its own after the last round; this also covers a run stopped earlier."""
        for context in self._contexts.values():
            NodeStore(context).forget()

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self._down = self._up = self._sent = 0
        self._type = ""
        replies = self.pull_messages(self.push_messages(messages))
        self.exchanges.append({"type": self._type, "down": self._down, "up": self._up,
                               "nodes": self._sent})
        return replies
