"""A peer's worlds (conformance.interface.worlds): a world in which no rank answers is
reported as missing on every rank, and once HUNG_LIMIT worlds have hung, further worlds fail
at once instead of each spending its timeout (a stuck peer runtime must not outlast CI)."""

from __future__ import annotations

import time

import pytest

from conformance.interface import worlds


def nap(rank: int, world: int, seconds: float) -> None:
    time.sleep(seconds)


def test_worlds_fail_at_once_after_the_hung_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worlds, "_HUNG", [])
    ok = worlds.world_outcomes(nap, 1, 0, timeout=60, error_grace=1)
    assert ok == {0: ("ok", None)}
    assert worlds._HUNG == []  # a world that answered is not counted
    for _ in range(worlds.HUNG_LIMIT):
        hung = worlds.world_outcomes(nap, 1, 600, timeout=3, error_grace=1)
        assert hung[0][0] == "missing"
    assert len(worlds._HUNG) == worlds.HUNG_LIMIT
    t0 = time.monotonic()
    refused = worlds.world_outcomes(nap, 2, 0, timeout=60, error_grace=1)
    assert time.monotonic() - t0 < 1  # no rank was started
    assert set(refused) == {0, 1}
    for status, why in refused.values():
        assert status == "missing"
        assert "not started" in why and "nap on 1 ranks" in why
    with pytest.raises(AssertionError, match=r"the load failed \[ex\]:\nrank 0: not started"):
        worlds.raise_failed("load", refused, "ex")
