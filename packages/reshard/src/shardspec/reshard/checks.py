"""One rank's checks of its own arguments, run before the agreement collective.

Each raises :class:`ReshardError`; the executor catches it and sends the message in its
agreement record, so that every rank raises it together (RESHARD-5, RESHARD-9). Nothing here
is collective: a check that failed here and raised on this rank alone would leave the others
waiting in the collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shardspec.metadata import Box

from .errors import ReshardError

if TYPE_CHECKING:
    import torch

__all__ = ["check_device", "check_tensors", "find_overlap", "has_internal_overlap"]

# Above this many bytes, two strided views of one storage whose byte ranges meet are taken to
# overlap without marking their bytes one by one (a false alarm is an error, never corruption).
_EXACT_OVERLAP_BYTES = 8 << 20


def check_device(dev: torch.device, backend: str, what: str) -> None:
    """Refuse a device this build or this backend cannot move data on."""
    import torch

    if dev.type == "meta":
        raise ReshardError(f"{what} is on the meta device, which holds no data")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ReshardError(f"{what} is on {dev}, but CUDA is not available in this process")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ReshardError(
                f"{what} is on {dev}, but this process sees {torch.cuda.device_count()} CUDA "
                "devices"
            )
    if backend == "nccl" and dev.type != "cuda":
        raise ReshardError(f"{what} is on {dev}; an NCCL group moves CUDA tensors only")
    if backend == "gloo" and dev.type not in ("cpu", "cuda"):
        raise ReshardError(f"{what} is on {dev}; a gloo group moves CPU or CUDA tensors only")


def check_tensors(
    tensors: list[torch.Tensor],
    boxes: tuple[Box, ...],
    dtype: torch.dtype | None,
    what: str,
    rank: int,
    item: str,
    items: str,
    side: str,
) -> torch.dtype | None:
    """Count, kind, shape and common dtype of one rank's tensors against its boxes of
    ``side``. Returns the dtype they share (``dtype`` if given, else the first tensor's)."""
    import torch

    if len(tensors) != len(boxes):
        # Sizes, not boxes: the offsets differ on every rank, and ranks that share a fault
        # share one line of the error (agreement.shared_problems).
        raise ReshardError(
            f"{what}rank {rank} passed {len(tensors)} {items} but owns {len(boxes)} "
            f"{side} boxes of sizes {[b.sizes for b in boxes]}"
        )
    for i, (t, box) in enumerate(zip(tensors, boxes)):
        name = f"{what}{item} #{i} on rank {rank}"
        if not isinstance(t, torch.Tensor):
            raise ReshardError(f"{name} is a {type(t).__name__}, not a tensor")
        _check_kind(t, name)
        if tuple(t.shape) != box.sizes:
            raise ReshardError(
                f"{name} has shape {tuple(t.shape)} but its {side} box has sizes {box.sizes}"
            )
        if dtype is None:
            dtype = t.dtype
        elif t.dtype != dtype:
            raise ReshardError(f"{name} has dtype {t.dtype}, expected {dtype}")
    return dtype


def _check_kind(t: torch.Tensor, name: str) -> None:
    """A plain strided tensor with data: what the executor can slice, view as bytes and copy
    without running anything of another rank's or another library's."""
    import torch

    if getattr(type(t), "__torch_dispatch__", None) is not torch._C._disabled_torch_dispatch_impl:
        raise ReshardError(
            f"{name} is a {type(t).__name__}, a tensor subclass that intercepts operations; "
            "pass its plain local tensor (a DTensor's to_local())"
        )
    if t.is_nested:
        raise ReshardError(f"{name} is a nested tensor; reshard moves strided tensors")
    if t.layout != torch.strided:
        raise ReshardError(f"{name} has layout {t.layout}; reshard moves strided tensors only")
    if t.is_quantized:
        raise ReshardError(f"{name} is quantized ({t.dtype}); dequantize it first")
    if t.device.type == "meta":
        raise ReshardError(f"{name} is on the meta device, which holds no data")
    if t.is_conj() or t.is_neg():
        raise ReshardError(
            f"{name} is a lazy conjugate or negative view; call resolve_conj() / resolve_neg()"
        )


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` may touch in its storage: ``[first, last + 1)``."""
    size = t.element_size()
    lo = int(t.storage_offset()) * size
    return lo, lo + size * (1 + sum((int(n) - 1) * s for n, s in zip(t.shape, t.stride())))


def _share_bytes(
    a: torch.Tensor, ra: tuple[int, int], b: torch.Tensor, rb: tuple[int, int]
) -> bool:
    """Whether two views of one storage, whose byte ranges ``ra`` and ``rb`` meet, hold a
    byte in common. A dense view fills its range, so meeting is overlapping; otherwise the
    bytes of both are marked over their joint span (or taken as shared when it is large)."""
    import torch

    if any(hi - lo == t.numel() * t.element_size() for t, (lo, hi) in ((a, ra), (b, rb))):
        return True
    lo, hi = min(ra[0], rb[0]), max(ra[1], rb[1])
    if hi - lo > _EXACT_OVERLAP_BYTES:
        return True
    address = torch.arange(hi - lo, dtype=torch.int64)
    held = []
    for t in (a, b):
        size = t.element_size()
        mine = torch.zeros(hi - lo, dtype=torch.bool)
        at = address.as_strided(
            (*t.shape, size), (*(s * size for s in t.stride()), 1), t.storage_offset() * size - lo
        )
        mine[at.reshape(-1)] = True
        held.append(mine)
    return bool((held[0] & held[1]).any())


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` are one memory location (an expanded tensor): writing
    into it fails, or keeps only one of the values."""
    import torch

    if t.numel() == 0:  # no elements, so no two of them share a location, whatever the strides
        return False
    if any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())):
        return True
    probe = getattr(torch, "_debug_has_internal_overlap", None)
    return probe is not None and probe(t) == 1


def find_overlap(
    inputs: Sequence[tuple[str, torch.Tensor]], outputs: Sequence[tuple[str, torch.Tensor]]
) -> str | None:
    """A description of the first output that shares memory with an input or another output
    (an ``out=`` tensor that is, or views, a local shard), or None. Inputs may share memory
    with each other: they are only read."""
    by_storage: dict[tuple[str, int], list[tuple[int, int, bool, str, torch.Tensor]]] = {}
    for is_out, group in ((False, inputs), (True, outputs)):
        for name, t in group:
            if t.numel() == 0:
                continue
            lo, hi = _byte_range(t)
            key = (str(t.device), t.untyped_storage().data_ptr())
            by_storage.setdefault(key, []).append((lo, hi, is_out, name, t))
    for views in by_storage.values():
        if len(views) < 2 or not any(v[2] for v in views):
            continue
        views.sort(key=lambda v: v[0])
        active: list[tuple[int, int, bool, str, torch.Tensor]] = []
        for v in views:
            active = [a for a in active if a[1] > v[0]]
            for a in active:
                if (a[2] or v[2]) and _share_bytes(a[4], (a[0], a[1]), v[4], (v[0], v[1])):
                    first, second = (a, v) if a[2] else (v, a)
                    return f"{first[3]} shares memory with {second[3]}"
            active.append(v)
    return None
