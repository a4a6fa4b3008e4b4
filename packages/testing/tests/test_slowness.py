"""Time limits scale with how slowly the machine answers (spec/05-conformance.md CONF-3): a
call that takes longer than its limit only because the machine is loaded passes, and a real
hang still fails."""

from __future__ import annotations

import time

import pytest
from testing_pool_cases import sleep

from shardspec.testing import RankCrash, RankPool, scaled, slowness, timing


@pytest.mark.rule("CONF-3")
def test_the_override_sets_the_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDSPEC_TIME_SCALE", "4")
    assert slowness() == 4.0 and scaled(10) == 40.0
    monkeypatch.setenv("SHARDSPEC_TIME_SCALE", "0.5")
    assert slowness() == 1.0, "never shorter than the limit as written"
    monkeypatch.setenv("SHARDSPEC_TIME_SCALE", "fast")
    with pytest.raises(ValueError, match="SHARDSPEC_TIME_SCALE must be a number"):
        slowness()


@pytest.mark.rule("CONF-3")
def test_load_and_a_slow_calibration_stretch_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDSPEC_TIME_SCALE", raising=False)
    monkeypatch.setattr(timing, "_calibrated", 1.0)
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (10.0, 10.0, 10.0))
    assert slowness() == 5.0  # ten runnable processes on two cores
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert slowness() == 1.0
    monkeypatch.setattr(timing, "_calibrated", 3.0)  # a machine 3x slower than idle CI
    assert slowness() == 3.0


@pytest.mark.rule("CONF-3")
def test_the_measured_factor_stops_at_ten_but_an_override_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SHARDSPEC_TIME_SCALE", raising=False)
    monkeypatch.setattr(timing, "_calibrated", 1.0)
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    # conformance_scale's 1024 simulated ranks: load about 240 on 2 cores, not 120x slower.
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (240.0, 200.0, 120.0))
    assert slowness() == 10.0 and scaled(632) == 6320.0
    # Eight busy processes beside the suite on 2 cores: the full factor, under the cap.
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (10.0, 9.0, 8.0))
    assert slowness() == 5.0
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (19.0, 9.0, 8.0))
    assert slowness() == 9.5  # just under the cap: still the load itself
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(timing, "_calibrated", 50.0)  # calibrated amid a burst of threads
    assert slowness() == 10.0
    monkeypatch.setattr(timing, "_calibrated", 7.5)
    assert slowness() == 7.5
    monkeypatch.setenv("SHARDSPEC_TIME_SCALE", "40")  # a person who knows the machine
    assert slowness() == 40.0


@pytest.mark.rule("CONF-3")
def test_a_slow_call_on_a_slow_machine_passes_and_a_hang_still_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSPEC_TIME_SCALE", "6")
    with RankPool(2, timeout=120) as pool:
        pool.call(sleep, 0)  # started under the pool's own limit
        # 2 s against a 1 s limit: the machine is "6x slow", so the limit is 6 s.
        assert pool.call(sleep, 2, timeout=1) == [0, 1]
        t0 = time.monotonic()
        with pytest.raises(RankCrash, match=r"did not answer within 1 s .*x6\.0.*: 6 s"):
            pool.call(sleep, 3600, timeout=1)
        assert 6 <= time.monotonic() - t0 < 6 + 30
