"""A process that loads the Flower apps gives freed blocks back to the system
(:mod:`gems_fl.heap`): glibc's mmap threshold held at 128 KiB."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Frees a 16 MiB block (which raises glibc's dynamic threshold to 16 MiB),
# then allocates twenty 2 MiB blocks and frees all but the last: the MiB still resident.
_PROBE = """
import sys
{setup}
import numpy as np

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20

big = np.ones(16 * 2 ** 20, dtype=np.uint8); del big
before = rss()
blocks = [np.ones(2 * 2 ** 20, dtype=np.uint8) for _ in range(20)]
del blocks[:-1]
print(rss() - before)
"""


def _retained(setup: str) -> float:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(setup=setup)], check=True,
                         capture_output=True, text=True, env={"PATH": ""})
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_go_back_to_the_system_in_a_process_that_loads_the_apps():
    # without it, the nineteen freed 2 MiB blocks stay resident in the heap
    assert _retained("") > 30
    assert _retained("from gems_fl.heap import return_freed_blocks; "
                     "assert return_freed_blocks()") < 8


def test_a_threshold_the_user_set_stands(monkeypatch):
    from gems_fl.heap import ENV_VAR, return_freed_blocks

    monkeypatch.setenv(ENV_VAR, "65536")
    assert return_freed_blocks() is False


def test_the_apps_module_holds_the_threshold():
    # the ClientApp's and ServerApp's processes import gems_fl.apps first
    import gems_fl.apps
    from gems_fl.heap import return_freed_blocks

    assert gems_fl.apps.return_freed_blocks is return_freed_blocks
