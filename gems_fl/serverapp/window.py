"""A sliding window of messages in flight, for Flower's simulation.

flwr 1.42's simulation engine hands messages to its ClientApp actors by sweeping, every
0.1 s, over every node and, for each, over every message still stored
(``vce_api.add_messages_to_queue`` -> ``InMemoryLinkState.get_message_ins``): a sweep
costs nodes x stored messages checks under the state's lock. With 1,000 nodes and a
round's 1,000 messages stored at once it kept about 0.8 of this machine's 2 cores busy
for the whole round (py-spy on the simulation process), time the nodes' own work did not
get. Only as many messages as the actors run at once are processed anyway, so
:class:`WindowedGrid` keeps at most ``window`` messages in flight and pushes the next as
replies arrive: the same messages, replies and timeouts, and each sweep costs
``window / nodes`` of what it did. Deployed SuperNodes work in parallel and keep the
plain Grid.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

#: Messages in flight at once: above what the actors of one machine run in parallel, so
#: none waits; a run of up to this many nodes is sent exactly as before.
SIMULATION_WINDOW = 100


class WindowedGrid(Grid):
    """``grid`` with :meth:`send_and_receive` keeping at most ``window`` messages in
    flight; everything else is ``grid``'s own."""

    def __init__(self, grid: Grid, window: int = SIMULATION_WINDOW,
                 pull_interval: float = 0.1) -> None:
        if window < 1:
            raise ValueError(f"window={window}: at least one message must be in flight")
        self._grid, self.window, self.pull_interval = grid, int(window), pull_interval

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push up to ``window`` messages, then one more for each reply, until every
        message has its reply or ``timeout`` seconds (for all of them) have passed;
        a message not pushed by then gets no reply, as one that timed out."""
        waiting = list(messages)
        deadline = None if timeout is None else time.time() + timeout
        in_flight: set[str] = set()
        replies: list[Message] = []
        while waiting or in_flight:
            room = self.window - len(in_flight)
            if waiting and room > 0:
                batch, waiting = waiting[:room], waiting[room:]
                in_flight.update(self._grid.push_messages(batch))
            got = list(self._grid.pull_messages(in_flight))
            replies.extend(got)
            in_flight.difference_update(m.metadata.reply_to_message_id for m in got)
            if deadline is not None and time.time() >= deadline:
                break
            if not got and (in_flight or waiting):
                time.sleep(self.pull_interval)
        return replies
