"""``shardspec.testing.memory``: the kernel's resident set and its peak since a reset."""

from __future__ import annotations

import pytest
import torch

from shardspec.testing.memory import peak_rss, reset_peak_rss, rss

MIB = 1 << 20


def test_the_peak_since_a_reset_counts_a_buffer_freed_before_it_was_read() -> None:
    if not reset_peak_rss():
        pytest.skip("this kernel does not let a process reset its peak RSS")
    before = rss()
    peak = peak_rss()
    assert peak is not None and peak < before + 32 * MIB
    buf = torch.ones(128 * MIB, dtype=torch.uint8)  # written: every page resident
    during = rss()
    del buf
    after = peak_rss()
    assert during >= before + 120 * MIB
    assert after is not None and after >= before + 120 * MIB
    assert reset_peak_rss()
    again = peak_rss()
    assert again is not None and again < after - 100 * MIB
