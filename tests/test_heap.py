"""A process that loads the Flower apps gives freed blocks back to the system
(:mod:`gems_fl.heap`): glibc's mmap and trim thresholds held at 128 KiB."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Frees a 16 MiB block, which raises glibc's dynamic mmap threshold to 16 MiB and its trim
# threshold to 32 MiB; then ``{setup}``; then allocates ``{count}`` blocks of ``{size}``
# bytes and frees them all but the last (or, ``{keep}`` false, all of them): the MiB
# still resident.
_PROBE = """
import numpy as np

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20

big = np.ones(16 * 2 ** 20, dtype=np.uint8); del big
{setup}
before = rss()
blocks = [np.ones({size}, dtype=np.uint8) for _ in range({count})]
del blocks[:{keep}]
print(rss() - before)
"""
_SET = "from gems_fl.heap import return_freed_blocks; assert return_freed_blocks()"


def _retained(setup: str, size: int, count: int, keep: bool) -> float:
    code = _PROBE.format(setup=setup, size=size, count=count, keep=-1 if keep else "")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={"PATH": ""})
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_go_back_to_the_system_after_the_threshold_was_raised():
    # twenty 2 MiB blocks: without it they come from the heap, and the nineteen freed
    # below the last stay resident
    assert _retained("", 2 * 2 ** 20, 20, keep=True) > 30
    assert _retained(_SET, 2 * 2 ** 20, 20, keep=True) < 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_free_top_of_the_heap_goes_back_after_the_threshold_was_raised():
    # 250 blocks of 100 KiB (below either threshold: from the heap), all freed: 24 MiB at
    # the heap's top, under the raised 32 MiB trim threshold, stay without it
    assert _retained("", 100 * 1024, 250, keep=False) > 16
    assert _retained(_SET, 100 * 1024, 250, keep=False) < 4


def test_a_threshold_the_user_set_stands(monkeypatch):
    from gems_fl.heap import ENV_VAR, return_freed_blocks

    monkeypatch.setenv(ENV_VAR, "65536")
    assert return_freed_blocks() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("module", ["gems_fl.clientapp.handlers", "gems_fl.serverapp.run"])
def test_the_processes_that_run_the_apps_hold_the_thresholds(module):
    # a simulation's ClientApp actor receives the app pickled: it imports the handlers'
    # module, never gems_fl.apps; the ServerApp's process imports its run's module.
    # Importing either, alone, is what gives the freed blocks back.
    assert _retained(f"import {module}", 2 * 2 ** 20, 20, keep=True) < 8
