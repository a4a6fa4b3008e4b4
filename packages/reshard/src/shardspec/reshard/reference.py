"""The single-process oracle: build the global tensor from the source shards, slice it.

Strict on purpose: every element must be covered, and replicas must agree bit for bit
(compared as bytes, so NaNs and signed zeros count), otherwise it raises instead of picking
one. Tests compare every rank's output of the distributed executor with this, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from shardspec.metadata import Layout, LayoutError

if TYPE_CHECKING:
    import torch

__all__ = ["materialize", "reshard", "same_bits"]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (NaN payloads and -0.0 included)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(_bytes(a), _bytes(b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    import torch

    t = t.resolve_conj().resolve_neg().contiguous()
    # A contiguous tensor's size-1 dims may carry any stride (0 after expand + clone), which
    # reshape keeps: as_strided gives the flat stride-1 view view(uint8) needs.
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def materialize(shards: Mapping[int, Sequence[torch.Tensor]], layout: Layout) -> torch.Tensor:
    """The global tensor from ``shards[rank]`` (each rank's tensors in local order)."""
    import torch

    layout.validate()
    dtype = _dtype(shards, layout)
    out = torch.empty(layout.shape, dtype=dtype)
    written = torch.zeros(layout.shape, dtype=torch.bool)
    for rank in layout.ranks:
        boxes = layout.boxes_of(rank)
        local = list(shards.get(rank, ()))
        if len(local) != len(boxes):
            raise LayoutError(f"rank {rank} has {len(local)} tensors but owns {len(boxes)} boxes")
        for i, (box, t) in enumerate(zip(boxes, local)):
            if tuple(t.shape) != box.sizes or t.dtype != dtype:
                raise LayoutError(
                    f"rank {rank} tensor #{i} has shape {tuple(t.shape)} dtype {t.dtype}; "
                    f"its box is {box} of dtype {dtype}"
                )
            if box.is_empty:
                continue
            sl = box.slices()
            if bool(written[sl].any()):
                if not same_bits(out[sl], t):
                    raise LayoutError(
                        f"replica of {box} on rank {rank} differs from another owner's"
                    )
                continue
            out[sl] = t
            written[sl] = True
    return out


def reshard(
    shards: Mapping[int, Sequence[torch.Tensor]], src: Layout, dst: Layout
) -> dict[int, list[torch.Tensor]]:
    """Every destination rank's tensors (in ``dst``'s local order), by slicing the global one."""
    if src.shape != dst.shape:
        raise LayoutError(f"source shape {src.shape} differs from destination shape {dst.shape}")
    dst.validate()
    full = materialize(shards, src)
    return {rank: [full[box.slices()].clone() for box in dst.boxes_of(rank)] for rank in dst.ranks}


def _dtype(shards: Mapping[int, Sequence[torch.Tensor]], layout: Layout) -> torch.dtype:
    import torch

    for rank in layout.ranks:
        for t in shards.get(rank, ()):
            return t.dtype
    return torch.get_default_dtype()
