"""The thread policy of the node and server path: one count, set once per step.

Every compute step of a node (local training, the radius or neuron search, the Fisher
axes) and of the server (layer merge, fine-tuning, evaluation) runs inside
:func:`compute_threads`, which sets torch's intra-op threads and the BLAS/OpenMP pools
(numpy, scikit-learn) to :func:`policy_threads` for the whole step.

Why one count for the whole step, and why 1 by default (measured with
``radius_search.py``, a benchmark retired after commit c4a7c72, on a 2-core machine shared
with other processes):

- Switching counts between training and search is what made the node's search slow:
  training ran under 1 thread, the search then ran on 2, and the first products after
  the switch stalled while OpenMP re-created and spun up its pool (0.42-4.2 s per node
  against 0.12 s warm). Nested ``compute_threads`` / :func:`single_thread` blocks with
  the count already in force change nothing, so the node's path never switches.
- Mini-batch training of these small models is a stream of tiny ops: a second thread
  buys nothing and, when the cores are shared, OpenMP's spinning barriers made an
  epoch up to 30x slower. The one big product of the radius search gains at most
  the number of free cores from more threads, and none when other processes use them.

``GEMS_FL_THREADS`` (an integer >= 1, or ``all`` for every core torch sees at import)
overrides the count, e.g. on a dedicated many-core machine that runs one node.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits

ENV_VAR = "GEMS_FL_THREADS"
DEFAULT_THREADS = 1
CORES = torch.get_num_threads()  # torch's default: the usable cores, before any change


def policy_threads() -> int:
    """The thread count of compute steps: ``GEMS_FL_THREADS`` if set, else 1."""
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if not raw:
        return DEFAULT_THREADS
    if raw == "all":
        return CORES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_VAR}={raw!r} must be an integer >= 1 or 'all'")
    return value


def concurrent_workers(tasks: int) -> int:
    """How many independent solves of one step (the selection round's candidates at each
    value of a point's grid) run at once, each on one thread: as many as the cores torch
    saw at import, at most ``tasks``; 1 when ``GEMS_FL_THREADS`` sets the count.

    Why not the policy's 1: the fits share nothing and each runs serial ops on its own
    thread (no OpenMP pool to spin), and while the server solves them the nodes wait for
    its message, so the cores are free. The result is the same as one after another.
    """
    if os.environ.get(ENV_VAR, "").strip():
        return 1
    return max(1, min(int(tasks), CORES))


@contextmanager
def compute_threads(threads: int | None = None) -> Iterator[int]:
    """Run torch, BLAS and OpenMP on ``threads`` threads (default :func:`policy_threads`).

    Restores the previous counts on exit. When the count is already in force (a
    nested block) torch's pool is left alone, so wrapping training and the search that
    follows in one block means neither of them switches the pool. Yields the count.
    """
    count = policy_threads() if threads is None else int(threads)
    if count < 1:
        raise ValueError(f"threads must be >= 1, got {threads!r}")
    previous = torch.get_num_threads()
    if previous != count:
        torch.set_num_threads(count)
    try:
        with threadpool_limits(limits=count):
            yield count
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread for the duration, then restore the previous count.

    Kept for the small-op loops (mini-batch training, per-neuron bisection) that must
    never run multi-threaded whatever the policy. Inside a ``compute_threads(1)``
    block it changes nothing.
    """
    previous = torch.get_num_threads()
    if previous != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
