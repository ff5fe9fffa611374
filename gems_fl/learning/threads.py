"""The thread policy of the node and server path."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread for the duration, then restore the previous count.

    Mini-batch training of these small models is a stream of tiny ops: a second
    intra-op thread buys nothing, and when the cores are shared (a simulation's
    ServerApp beside its client workers, or a test run beside anything else) OpenMP's
    spinning barriers made an epoch 30x slower on a 2-core machine.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
