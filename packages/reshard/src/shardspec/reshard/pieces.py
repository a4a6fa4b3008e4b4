"""A piece's bytes in the tensors that hold it: what both transports of the executor copy
(:mod:`shardspec.reshard.executor` with one ``all_to_all_single`` a round,
:mod:`shardspec.reshard.messages` with point-to-point messages).

A :class:`Job` is one tensor of a call: its plan for this rank, its inputs and outputs on
this rank and its agreed dtype. A piece's elements ``[e0, e1)`` (row-major within the piece)
are copied to or from a byte buffer by :func:`copy_range`, as one byte copy where the piece is
one run of its tensor's bytes, else as at most ``2 * ndim - 1`` strided views."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardspec.metadata import Layout

from .blocks import flat_blocks
from .planner import Piece, Plan
from .schedule import Entry, contiguous_span, local_stream, piece_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "DIRECT_COUNTS",
    "Job",
    "Span",
    "bytes_of",
    "copy_local",
    "copy_piece",
    "copy_range",
    "flat_bytes",
    "holder",
    "rel",
    "run_bytes",
    "send_scratch",
    "span_of",
]


@dataclass
class Job:
    """One tensor of a call, as the transports see it."""

    key: str
    src: Layout
    dst: Layout
    plan: Plan
    inputs: list[torch.Tensor]
    dtype: torch.dtype | None = None
    itemsize: int = 0
    outputs: list[torch.Tensor] = field(default_factory=list)
    given: list[torch.Tensor] | None = None  # the caller's ``out`` tensors


def rel(
    piece: Piece, outer_offsets: tuple[int, ...], block: tuple[tuple[int, ...], tuple[int, ...]]
) -> tuple[slice, ...]:
    offs, sizes = block
    return tuple(
        slice(po - oo + b, po - oo + b + s)
        for po, oo, b, s in zip(piece.offsets, outer_offsets, offs, sizes)
    )


def copy_piece(job: Job, p: Piece, src_t: torch.Tensor, dst_t: torch.Tensor) -> None:
    whole = ((0,) * len(p.sizes), p.sizes)
    src_off = job.src.shards[p.src_shard].box.offsets
    dst_off = job.dst.shards[p.dst_shard].box.offsets
    dst_t[rel(p, dst_off, whole)].copy_(src_t[rel(p, src_off, whole)])


# How often an exchange used a tensor itself as the receive / send buffer, or packed its sends
# into the local pieces' place in an output (scratch), on this process: a debug hook for the
# tests (the only way to tell the paths apart from outside is memory).
DIRECT_COUNTS = {
    "recv": 0,
    "send": 0,
    "self": 0,
    "scratch": 0,
    "sent directly": 0,
    "received directly": 0,
}


Span = tuple["torch.Tensor", int, int]  # a contiguous tensor and a byte range [lo, hi) of it


def span_of(streams: list[list[Entry[Job]]], sending: bool) -> Span | None:
    """The tensor and byte range that holds every stream back to back, in order, or None
    (see :func:`shardspec.reshard.schedule.contiguous_span`): the inputs when ``sending``, else the
    outputs."""

    def held(e: Entry[Job]) -> tuple[torch.Tensor, Sequence[int], Sequence[int]] | None:
        t, outer = holder(e, sending)
        return (t, t.shape, outer) if t.is_contiguous() else None

    return contiguous_span(streams, held)


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a 1-d uint8 view. Not ``reshape(-1)``: a
    contiguous tensor may keep any stride on a dimension of size 1, and a dtype view needs
    stride 1."""
    import torch

    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def flat_bytes(span: Span) -> torch.Tensor:
    t, lo, hi = span
    return bytes_of(t)[lo:hi]


def copy_local(jobs: list[Job], rank: int) -> None:
    for job in jobs:
        for p in job.plan.local(rank):
            copy_piece(job, p, job.inputs[p.src_local], job.outputs[p.dst_local])


def send_scratch(jobs: list[Job], rank: int, size: int) -> torch.Tensor | None:
    """Where the sends can be packed without new memory: the bytes of an output that only this
    rank's local pieces fill, back to back, when there are at least ``size`` of them; else None.

    A new send buffer is fresh anonymous memory, which the kernel zero-fills page by page on
    first touch: a strided copy of 128 MiB into new memory took 4.6x the same copy into touched
    memory here (0.35 s against 0.076 s, 2026-11-29), and packing into a new buffer was most of
    ``load(reads="once")``'s exchange beyond one ``all_to_all_single`` of its bytes.
    The local pieces' place in the outputs is memory the call writes anyway, that no received
    byte lands in (every output element comes from one piece) and that shares nothing with an
    input (RESHARD-9), so it holds the sends until the last round and the local pieces are
    copied in after it."""
    if size == 0:
        return None
    span = span_of([local_stream(jobs, rank)], sending=False)
    if span is None or span[2] - span[1] < size:
        return None
    return flat_bytes(span)[:size]


def holder(e: Entry[Job], sending: bool) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tensor that holds the entry's piece on this rank (its input when ``sending``, else
    its output) and the offsets of that tensor's box."""
    job, p = e.job, e.piece
    if sending:
        return job.inputs[p.src_local], job.src.shards[p.src_shard].box.offsets
    return job.outputs[p.dst_local], job.dst.shards[p.dst_shard].box.offsets


def run_bytes(e: Entry[Job], e0: int, e1: int, sending: bool) -> torch.Tensor | None:
    """The bytes of elements ``[e0, e1)`` of the entry's piece in the tensor that holds it
    (:func:`holder`), when the piece is one run of that contiguous tensor's bytes (so is any
    run of its elements); else None."""
    job, p = e.job, e.piece
    tensor, outer = holder(e, sending)
    if not tensor.is_contiguous():
        return None
    span = piece_bytes(tensor.shape, outer, p, job.itemsize)
    if span is None:
        return None
    return bytes_of(tensor)[span[0] + e0 * job.itemsize : span[0] + e1 * job.itemsize]


def copy_range(e: Entry[Job], e0: int, e1: int, buf: torch.Tensor, pos: int, *, pack: bool) -> None:
    import torch

    job, p = e.job, e.piece
    assert job.dtype is not None
    mine = run_bytes(e, e0, e1, pack)
    if mine is not None:
        # one byte copy, whatever the alignment: most pieces of a state dict of small tensors
        raw = buf[pos : pos + mine.numel()]
        if pack:
            raw.copy_(mine)
        else:
            mine.copy_(raw)
        return
    tensor, outer = holder(e, pack)
    for block in flat_blocks(p.sizes, e0, e1):
        n = math.prod(block[1]) * job.itemsize
        view = tensor[rel(p, outer, block)]
        raw = buf[pos : pos + n]
        if (buf.storage_offset() + pos) % job.itemsize == 0:
            wire = raw.view(job.dtype).view(block[1])
            if pack:
                wire.copy_(view)
            else:
                view.copy_(wire)
        else:
            # A typed view of bytes needs an offset that is a multiple of the element size;
            # copy bytes instead, through a contiguous scratch block when the view is strided.
            if pack:
                raw.copy_(bytes_of(view.contiguous()))
            elif view.is_contiguous():
                bytes_of(view).copy_(raw)
            else:
                scratch = torch.empty(block[1], dtype=job.dtype, device=view.device)
                bytes_of(scratch).copy_(raw)
                view.copy_(scratch)
        pos += n
