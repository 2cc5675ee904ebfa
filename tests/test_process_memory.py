"""The CPU's peak memory: the process's resident-set high-water mark, reset per measurement."""
import math
import sys

import pytest
import torch

from golinear.bench.speed import process_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/self")


def test_the_peak_follows_a_large_tensor_and_drops_after_a_reset():
    process_memory.reset_peak()
    before = process_memory.peak_gib()
    x = torch.ones(64, 2**20)  # 256 MiB, touched
    held = process_memory.peak_gib()
    del x
    process_memory.reset_peak()
    after = process_memory.peak_gib()
    assert math.isfinite(before) and held - before > 0.2  # GiB
    assert after < held - 0.2  # the freed tensor no longer counts once the mark is reset
