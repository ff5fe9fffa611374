"""An app process gives back the memory it frees: glibc's mmap and trim thresholds, held.

A simulation's ClientApp process serves node after node, and its ServerApp process folds
reply after reply into its sums; each step allocates and frees temporaries of 1 MiB to
150 MiB. glibc maps a block of at least its mmap threshold on its own and unmaps it when
freed, but raises that threshold to the size of each such block freed (up to 32 MiB).
After the first large temporary, later ones of up to 32 MiB therefore came from the
heaps, where freed blocks stayed resident between the ones still in use (and glibc raises
the trim threshold with it, so a heap's free top stayed too). :func:`return_freed_blocks`
holds both thresholds at their initial 128 KiB for the process; docs/scale.md gives what
that saved at 100 kernel nodes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: glibc's ``mallopt`` parameters (malloc.h): the mmap threshold, and the free bytes at a
#: heap's top from which it is trimmed (which glibc raises with the former)
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1
#: both thresholds held at glibc's own initial value
MMAP_THRESHOLD = 128 * 1024
#: glibc's environment variable for the same; where a user set it, theirs stands
ENV_VAR = "MALLOC_MMAP_THRESHOLD_"


def return_freed_blocks() -> bool:
    """Hold glibc's mmap and trim thresholds at :data:`MMAP_THRESHOLD` for this process,
    so every block from that size on goes back to the system when freed, and so does the
    free memory at a heap's top, even where imports before this call had raised both.
    Returns whether it was set: not on a C library without ``mallopt`` (macOS, Windows),
    nor where :data:`ENV_VAR` is set."""
    if not sys.platform.startswith("linux") or ENV_VAR in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1,
                mallopt(M_TRIM_THRESHOLD, MMAP_THRESHOLD) == 1])
