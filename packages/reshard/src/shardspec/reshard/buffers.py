"""The executor's wire buffers kept from one bounded call to the next (RESHARD-6)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["keep", "kept_buffer", "release_buffers", "take_kept"]


# Wire buffers kept between calls made with max_buffer_bytes (which bounds them: at most two
# a device, a send and a receive buffer, each a round's bytes): a new buffer is fresh memory
# the kernel zero-fills page by page as it is first written, and packing a round into it
# cost 2-4x packing into memory touched before (see pieces.send_scratch), once per call. A job
# that reshards or refits every step keeps them, as engines keep their transfer buffers;
# :func:`release_buffers` returns them. Locked: a simulated world's ranks are threads.
_KEPT: dict[str, list[torch.Tensor]] = {}
_KEPT_PER_DEVICE = 2
_KEPT_LOCK = threading.Lock()


def take_kept(size: int, dev: torch.device) -> torch.Tensor:
    import torch

    with _KEPT_LOCK:
        free = _KEPT.get(str(dev), [])
        fits = [i for i, b in enumerate(free) if b.numel() >= size]
        if fits:
            return free.pop(min(fits, key=lambda i: free[i].numel()))
    return torch.empty(size, dtype=torch.uint8, device=dev)


def keep(buffers: list[torch.Tensor]) -> None:
    with _KEPT_LOCK:
        for buf in buffers:
            free = _KEPT.setdefault(str(buf.device), [])
            free.append(buf)
            free.sort(key=lambda b: -b.numel())
            del free[_KEPT_PER_DEVICE:]


def release_buffers() -> None:
    """Free the wire buffers the executor kept from calls made with ``max_buffer_bytes``."""
    with _KEPT_LOCK:
        _KEPT.clear()


def kept_buffer(size: int, dev: torch.device, held: list[torch.Tensor] | None) -> torch.Tensor:
    import torch

    if size == 0 or held is None:
        return torch.empty(size, dtype=torch.uint8, device=dev)
    buf = take_kept(size, dev)
    held.append(buf)
    return buf[:size]
