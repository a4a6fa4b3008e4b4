"""How slowly this machine answers now, so that every time limit of the suite scales with it.

A time limit inside a test is there to catch a hang, not to measure speed: on a loaded 2-core
machine a pool call that takes 2 s idle can take 20, and a fixed 10 s limit then turns a pass
into a failure. :func:`scaled` stretches a limit written for an idle machine by
:func:`slowness`, the largest of

* ``SHARDSPEC_TIME_SCALE``, when set (an override: CI or a person who knows the machine);
* a calibration measured once per process: a fixed pure-Python workload timed against what
  it takes on an idle 2-core machine (``_IDLE_SECONDS``), median of five runs;
* the load now: runnable processes per core over the last minute (``os.getloadavg``), read at
  every call, so that load that starts after the calibration still counts;

and never less than 1. A real hang still fails: only later, by the same factor.

The two measured terms stop at :data:`MAX_MEASURED` (10). The load average counts threads, not
how slowly we answer: a thread-simulated world of 1024 ranks (``conformance_scale``) keeps it
near 240 on 2 cores, a factor of 120 that would let a hung 632 s call go unnoticed for 21
hours. The ordinary loads the factor is for stay well under the cap: eight busy processes
beside the suite on 2 cores give about 5 (load 10), and the calibration measures about as
much. A machine really slower than 10x is set by hand with ``SHARDSPEC_TIME_SCALE``, which
has no cap.
"""

from __future__ import annotations

import os
import statistics
import time

__all__ = ["MAX_MEASURED", "scaled", "slowness"]

# The workload below on an idle 2-core x86 machine of the kind CI runs on (about 20 ms);
# a faster machine gives a ratio under 1, which counts as 1.
_IDLE_SECONDS = 0.02
_calibrated: float | None = None
# Twice the slowness of the heaviest ordinary load (8 busy processes on 2 cores, about 5x);
# past it the load average measures thread counts more than speed (see the module doc).
MAX_MEASURED = 10.0


def _workload() -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(200_000):
        s += i * i
    return time.perf_counter() - t0


def _calibration() -> float:
    global _calibrated
    if _calibrated is None:
        _calibrated = statistics.median(_workload() for _ in range(5)) / _IDLE_SECONDS
    return _calibrated


def _load() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return 1.0


def slowness() -> float:
    """How many times slower than an idle machine this one answers now (at least 1)."""
    override = os.environ.get("SHARDSPEC_TIME_SCALE")
    if override:
        try:
            return max(1.0, float(override))
        except ValueError:
            raise ValueError(
                f"SHARDSPEC_TIME_SCALE must be a number (a factor >= 1), got {override!r}"
            ) from None
    return max(1.0, min(MAX_MEASURED, max(_calibration(), _load())))


def scaled(seconds: float) -> float:
    """``seconds`` (a limit for an idle machine) stretched by :func:`slowness`."""
    return seconds * slowness()
