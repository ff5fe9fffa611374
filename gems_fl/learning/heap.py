"""Freed memory handed back to the system after a node's message.

A simulation's ClientApp process serves one node's message after another and then waits,
often for minutes, while the others and the server work. What a message's arrays took
(the kernel model's Gram matrix, its mapped rows, the selection round's solves) is freed
when the message ends, but glibc's allocator keeps most of it in its heap for the next
allocation, so an idle process kept 1.6-1.7 GB and two of them held half of a 5-site
kernel run's peak. :func:`release_freed_memory` asks the allocator to return what it no
longer uses (``malloc_trim``); nothing that is still in use moves, so no result changes.
Where the C library has no ``malloc_trim`` (not glibc: macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

logger = logging.getLogger(__name__)


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Return the heap's free memory to the system; True where the C library could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
