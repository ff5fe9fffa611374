"""The round vocabulary: every message names its round; the node answers through one table."""

from __future__ import annotations

import pytest
from flwr.app import Context, Message, MessageType, RecordDict

from gems_fl.clientapp.handlers import HANDLERS, handle
from gems_fl.protocol import wire
from gems_fl.protocol.rounds import ROUND_NAME_KEY, Round, round_messages, round_of, sent_bytes
from tests.helpers import FAST, app_defaults, run_in_process


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages built outside a run need Flower's task identity (as in test_nodes.py)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID


def test_every_round_has_one_node_handler_and_travels_as_one_message_type():
    assert set(HANDLERS) == set(Round)
    assert {r.message_type for r in Round} == {MessageType.TRAIN, MessageType.QUERY,
                                               MessageType.EVALUATE}
    assert Round.IDENTIFY.message_type == MessageType.QUERY
    assert Round.VERIFY.message_type == MessageType.EVALUATE
    assert Round.REFINE.message_type == MessageType.TRAIN


def test_round_messages_name_the_round_and_leave_the_source_content_alone():
    content = wire.encode_config({"seed": 3})
    per_node = {7: wire.encode_config({"seed": 4}), 8: content}
    shared = round_messages(Round.SELECT, content, [7, 8], group_id="2", ttl=30.0)
    mixed = round_messages(Round.VERIFY, per_node, [7, 8], group_id="verify")
    assert ROUND_NAME_KEY not in content.config_records[wire.CONFIG_KEY]
    assert [m.metadata.message_type for m in shared] == [MessageType.TRAIN] * 2
    assert [m.metadata.dst_node_id for m in shared] == [7, 8]
    assert shared[0].content is shared[1].content  # one named copy for a shared content
    assert [wire.decode_config(m.content)[ROUND_NAME_KEY] for m in mixed] == ["verify"] * 2
    assert [wire.decode_config(m.content)["seed"] for m in mixed] == [4, 3]
    assert sent_bytes(shared) == 2 * wire.content_bytes(shared[0].content) > \
        2 * wire.content_bytes(content)


@pytest.mark.parametrize("config, message_type, error", [
    ({}, MessageType.TRAIN, "names no round"),
    ({ROUND_NAME_KEY: "teleport"}, MessageType.TRAIN, "does not know"),
    ({ROUND_NAME_KEY: "identify"}, MessageType.TRAIN, "travels as 'query'"),
])
def test_a_message_without_a_known_round_of_its_type_is_refused_saying_why(config, message_type,
                                                                         error):
    with pytest.raises(ValueError, match=error):
        round_of(config, message_type)
    msg = Message(content=wire.encode_config({**app_defaults(), **FAST, **config}),
                  message_type=message_type, dst_node_id=1, group_id="1")
    with pytest.raises(ValueError, match=error):
        handle(msg, Context(run_id=1, node_id=1, node_config={"partition-id": 0,
                                                             "num-partitions": 2},
                            state=RecordDict(), run_config={}))


def test_a_run_names_every_round_it_sends(tmp_path):
    """Through the real apps, each message names its round, as its round's type."""
    from client_app import app as client_app

    seen: list[tuple[str, str]] = []

    def app(msg: Message, context: Context) -> Message:
        config = msg.content.config_records.get(wire.CONFIG_KEY)
        if config is not None:
            seen.append((str(config[ROUND_NAME_KEY]), msg.metadata.message_type))
        return client_app(msg, context)

    run_in_process(2, tmp_path, client=app, space="gram")
    assert {name for name, _ in seen} >= {"identify", "spaces", "select", "verify"}
    assert all(Round(name).message_type == kind for name, kind in seen)
