"""SIGINT, SIGTERM and SIGHUP as an exception in the main thread, so that a launcher can
stop everything it started and say so (``gems-fl run`` exits ``128 + signal``)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Signalled(BaseException):
    """Raised in the main thread by the signal handler (not an ``Exception``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Signalled` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Signalled(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def hold_signals() -> None:
    """Ignore further signals while cleaning up (a second Ctrl-C must not cut it short)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
