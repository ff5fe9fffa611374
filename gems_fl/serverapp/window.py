"""The server's grid: replies handed on as they arrive, and in Flower's simulation a
sliding window of messages in flight.

Flower's ``send_and_receive`` returns a round's replies together, so a round of 100
kernel nodes held 850 MB of replies at once although the server folds each into its sums
(:class:`~gems_fl.geometry.gram_sums.GramSums`) and keeps a few hundred kilobytes of it.
:class:`WindowedGrid` yields each reply as it is pulled: a caller that folds as it goes
holds the replies in flight, not the round's.

flwr 1.42's simulation engine hands messages to its ClientApp actors by sweeping, every
0.1 s, over every node and, for each, over every message still stored
(``vce_api.add_messages_to_queue`` -> ``InMemoryLinkState.get_message_ins``): a sweep
costs nodes x stored messages checks under the state's lock. With 1,000 nodes and a
round's 1,000 messages stored at once it kept about 0.8 of this machine's 2 cores busy
for the whole round (py-spy on the simulation process), time the nodes' own work did not
get. Only as many messages as the actors run at once are processed anyway, so in a
simulation :class:`WindowedGrid` keeps at most ``window`` messages in flight and pushes
the next as replies arrive: the same messages, replies and timeouts, and each sweep costs
``window / nodes`` of what it did. Deployed SuperNodes work in parallel: no window.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

#: Messages in flight at once: above what the actors of one machine run in parallel, so
#: none waits; a run of up to this many nodes is sent exactly as before.
SIMULATION_WINDOW = 100


class WindowedGrid(Grid):
    """``grid`` whose :meth:`send_and_receive` yields replies as they arrive, keeping at
    most ``window`` messages in flight (None: all of them); everything else is ``grid``'s
    own."""

    def __init__(self, grid: Grid, window: int | None = SIMULATION_WINDOW,
                 pull_interval: float = 0.1) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window={window}: at least one message must be in flight")
        self._grid, self.pull_interval = grid, pull_interval
        self.window = None if window is None else int(window)

    @property
    def grid(self) -> Grid:
        """The grid this one sends through."""
        return self._grid

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

    def get_nodes(self):
        return self._grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterator[Message]:
        """Push up to ``window`` messages, then one more for each reply, until every
        message has its reply or ``timeout`` seconds (for all of them) have passed;
        a message not pushed by then gets no reply, as one that timed out. Each reply is
        yielded as it is pulled (the messages go out when the iteration starts)."""
        waiting = list(messages)
        window = self.window or max(len(waiting), 1)
        deadline = None if timeout is None else time.time() + timeout
        in_flight: set[str] = set()
        while waiting or in_flight:
            room = window - len(in_flight)
            if waiting and room > 0:
                batch, waiting = waiting[:room], waiting[room:]
                in_flight.update(self._grid.push_messages(batch))
            got = list(self._grid.pull_messages(in_flight))
            arrived = bool(got)
            in_flight.difference_update(m.metadata.reply_to_message_id for m in got)
            while got:
                yield got.pop(0)  # the caller's copy is the only one left
            if deadline is not None and time.time() >= deadline:
                break
            if not arrived and (in_flight or waiting):
                time.sleep(self.pull_interval)
