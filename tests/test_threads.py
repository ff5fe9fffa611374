"""The thread policy: one count for a whole compute step, no switch inside it."""

from __future__ import annotations

import pytest
import torch

from gems_fl.learning import threads
from gems_fl.learning.threads import compute_threads, policy_threads, single_thread


def test_policy_default_and_environment(monkeypatch):
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    assert policy_threads() == 1
    monkeypatch.setenv(threads.ENV_VAR, "3")
    assert policy_threads() == 3
    monkeypatch.setenv(threads.ENV_VAR, "all")
    assert policy_threads() == threads.CORES
    monkeypatch.setenv(threads.ENV_VAR, "0")
    with pytest.raises(ValueError, match="GEMS_FL_THREADS='0' must be an integer >= 1 or 'all'"):
        policy_threads()


def test_compute_threads_sets_and_restores(monkeypatch):
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    before = torch.get_num_threads()
    with compute_threads() as count:
        assert count == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with compute_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


def test_nested_blocks_with_the_same_count_never_switch(monkeypatch):
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    calls = []
    original = torch.set_num_threads
    with compute_threads(1):
        monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n) or original(n))
        with compute_threads():
            with single_thread():
                assert torch.get_num_threads() == 1
        assert calls == []  # training + search inside one block: the pool is left alone
        monkeypatch.setattr(torch, "set_num_threads", original)
