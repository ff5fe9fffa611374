"""The protocol's rounds by name: every message the server sends names its round.

A node answers a message by the round it names (:func:`round_of`), through one table
(:mod:`gems_fl.clientapp.handlers`); the server builds every round's messages with
:func:`round_messages`, which names the round and gives each message the Flower message
type that round travels as. A new round is one name here and one handler on each side.

=============== ======== =====================================================================
round           type     what the node does
=============== ======== =====================================================================
``identify``    query    says who it is and what data it holds (:mod:`~.roster`)
``map``         query    sends summaries of its rows for the model's map (:mod:`~.map_round`)
``spaces``      train    fits its local model and sends its good-enough space (round 1; noised
                         sums under ``dp-epsilon``, bounds under secure aggregation)
``layer``       train    a layer-wise round of the MLP: one hidden layer's neuron spaces, or the
                         output layer's space
``secure-sums`` train    SecAgg+'s fit instruction: its masked statistics (:mod:`~.secure`)
``select``      train    scores the candidate points on its validation rows
``refine``      train    its cross-entropy gradient at the server's model
``local-model`` train    its whole round-1 local MLP (the node-side Local and Averaged rows)
``verify``      evaluate scores the server's models on its own data against its own eps
=============== ======== =====================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from gems_fl.protocol.wire import CONFIG_KEY, content_bytes

__all__ = ["ROUND_NAME_KEY", "Round", "name_round", "round_messages", "round_of", "sent_bytes"]

#: the config key every message names its round by (in its ``wire.CONFIG_KEY`` record)
ROUND_NAME_KEY = "gems-round-name"


class Round(StrEnum):
    """The rounds of the protocol, as messages name them."""

    IDENTIFY = "identify"
    MAP = "map"
    SPACES = "spaces"
    LAYER = "layer"
    SECURE_SUMS = "secure-sums"
    SELECT = "select"
    REFINE = "refine"
    LOCAL_MODEL = "local-model"
    VERIFY = "verify"

    @property
    def message_type(self) -> str:
        """The Flower message type this round travels as."""
        return _MESSAGE_TYPES.get(self, MessageType.TRAIN)


_MESSAGE_TYPES = {Round.IDENTIFY: MessageType.QUERY, Round.MAP: MessageType.QUERY,
                  Round.VERIFY: MessageType.EVALUATE}


def name_round(config: Mapping[str, Any], round_name: Round) -> dict[str, Any]:
    """``config`` with ``round_name`` in it (for a record built elsewhere: SecAgg+'s fit
    instruction)."""
    return {**config, ROUND_NAME_KEY: str(round_name)}


def round_of(config: Mapping[str, Any], message_type: str) -> Round:
    """The round a message's decoded ``config`` names, checked against the Flower message
    type it came as. Raises ``ValueError`` saying what is wrong: no name (a server of
    another version), an unknown name, or a round sent as the wrong type."""
    name = config.get(ROUND_NAME_KEY)
    if name is None:
        raise ValueError(f"the message names no round (no '{ROUND_NAME_KEY}' in its config): "
                         "the server runs another version of gems-fl; run the same version "
                         "on the server and every node")
    try:
        named = Round(str(name))
    except ValueError:
        raise ValueError(f"the message names round '{name}', which this node does not know "
                         f"(known: {', '.join(r.value for r in Round)}); run the same "
                         "version of gems-fl on the server and every node") from None
    if named.message_type != message_type:
        raise ValueError(f"round '{named}' came as a '{message_type}' message; it travels "
                         f"as '{named.message_type}'")
    return named


def round_messages(round_name: Round, contents: RecordDict | Mapping[int, RecordDict],
                   node_ids: Iterable[int], *, group_id: str, ttl: float | None = None
                   ) -> list[Message]:
    """One message of ``round_name`` to each of ``node_ids``: ``contents`` (one content
    for all, or one per node id) with the round named in its config record, as the round's
    message type."""
    named: dict[int, RecordDict] = {}

    def content_for(node_id: int) -> RecordDict:
        source = contents if isinstance(contents, RecordDict) else contents[node_id]
        key = id(source)
        if key not in named:  # one named copy per distinct content, shared like the source
            named[key] = _named(source, round_name)
        return named[key]

    extra = {} if ttl is None else {"ttl": ttl}
    return [Message(content=content_for(n), message_type=round_name.message_type,
                    dst_node_id=n, group_id=group_id, **extra) for n in node_ids]


def _named(content: RecordDict, round_name: Round) -> RecordDict:
    """A shallow copy of ``content`` whose config record names ``round_name`` (the arrays
    are shared, not copied)."""
    records = dict(content.items())
    config = dict(records[CONFIG_KEY]) if CONFIG_KEY in records else {}
    records[CONFIG_KEY] = ConfigRecord(name_round(config, round_name))
    return RecordDict(records)


def sent_bytes(messages: Iterable[Message]) -> int:
    """Bytes of the messages' records, as :func:`gems_fl.protocol.wire.content_bytes`
    counts them (a content shared by several messages counts once per message)."""
    return sum(content_bytes(m.content) for m in messages)
