"""release_openmp_workers: the calling thread's OpenMP pool goes away, and torch computes as before."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from roseinfer.engine.openmp import release_openmp_workers


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts threads in /proc; torch ships libgomp on Linux"
)
@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one torch thread: there is no pool to free")
def test_the_calling_threads_pool_is_freed_and_comes_back_on_demand():
    x = torch.randn(256, 256)
    expected = x @ x  # parallel work: this thread now has a pool of get_num_threads() - 1 workers
    with_pool = _threads()
    assert release_openmp_workers()
    deadline = time.monotonic() + 5
    while _threads() > with_pool - (torch.get_num_threads() - 1) and time.monotonic() < deadline:
        time.sleep(0.01)  # the workers leave as soon as they are released; give them a moment to exit
    assert _threads() == with_pool - (torch.get_num_threads() - 1)
    torch.testing.assert_close(x @ x, expected)  # the next parallel operator starts a new pool
    assert _threads() == with_pool
