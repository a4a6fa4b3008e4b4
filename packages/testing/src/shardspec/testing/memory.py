"""This process's memory as the Linux kernel counts it: the resident set and its peak since a
reset. A peak read this way is exact and costs nothing while the work runs, where a thread
sampling beside the work misses short peaks and takes the cores it measures."""

from __future__ import annotations

import os

__all__ = ["peak_rss", "reset_peak_rss", "rss"]


def rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int | None:
    """The kernel's peak resident bytes of this process (VmHWM); None where it keeps none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Set the peak to the resident bytes now (``clear_refs`` 5, Linux >= 4.0); False where the
    kernel does not let this process, and then :func:`peak_rss` means nothing."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return peak_rss() is not None
