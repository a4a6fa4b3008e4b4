"""Comparing the values of two DCP checkpoints, chunk by chunk (CKPT-10).

The two checkpoints may cut a tensor into different chunks: each chunk of the side with fewer
chunks is compared with the part of every chunk of the other side it overlaps, so every
element is compared once whatever the two layouts. Memory holds one chunk of each side at a
time (the inner chunk last read is kept, since consecutive outer chunks often meet it again),
and the comparison itself runs over slabs of at most :data:`BLOCK` elements. An inner chunk
is read again for each outer chunk it meets (rows against columns: every pair), the price of
bounded memory. torch is imported on first use.

Two values are the same when equal, when both are NaN, or with a tolerance when
``|a - b| <= atol + rtol * |b|`` (``torch.isclose``). Integers and bools compare exactly
unless a tolerance is given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardspec.metadata.box import Box

from .report import TensorReport
from .saved_chunks import read_saved_chunk

if TYPE_CHECKING:
    import torch

__all__ = ["BLOCK", "ValueDifference", "diff_tensor_values"]

BLOCK = 1 << 22  # elements per comparison slab (a few tens of MiB of temporaries at most)


@dataclass(frozen=True)
class ValueDifference:
    """A tensor whose values differ: how many elements, the largest difference ``|a - b|``
    (``inf`` where one side is NaN or an infinity and the other is not), its global index and
    the two values there."""

    key: str
    count: int
    numel: int
    max_diff: float
    where: tuple[int, ...]
    a: str
    b: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "fqn": self.key,
            "what": "values",
            "count": self.count,
            "numel": self.numel,
            "max_diff": self.max_diff if math.isfinite(self.max_diff) else str(self.max_diff),
            "where": list(self.where),
            "a": self.a,
            "b": self.b,
        }


def diff_tensor_values(
    root_a: str | os.PathLike[str],
    a: TensorReport,
    root_b: str | os.PathLike[str],
    b: TensorReport,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    on_chunk: Callable[[int], None] | None = None,
) -> ValueDifference | None:
    """The difference between tensor ``a`` under ``root_a`` and ``b`` under ``root_b`` (same
    shape and dtype, valid chunks), or None when every element is the same. ``on_chunk`` is
    called with the bytes of the tensor (elements x item size) each outer chunk covered once
    it is compared, so the calls add up to ``a.nbytes`` (a progress bar).
    A chunk that cannot be read raises :class:`.saved_chunks.ChunkDataError`."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"{a.fqn!r}: compare values only of tensors of one shape and dtype")
    # The side with fewer chunks is the outer loop: each inner chunk is read once per outer
    # chunk it meets, so the bytes read are about (outer chunks) x (inner tensor) at worst
    # (rows against columns), and fewer outer chunks read less.
    swap = len(b.chunks) < len(a.chunks)
    (outer, root_o), (inner, root_i) = (
        ((b, root_b), (a, root_a)) if swap else ((a, root_a), (b, root_b))
    )
    acc = _Worst()
    inner_boxes = [c.box for c in inner.chunks]
    cached: tuple[int, torch.Tensor] | None = None
    for i, co in enumerate(outer.chunks):
        box_o = co.box
        if box_o.is_empty:
            continue
        data_o = read_saved_chunk(root_o, outer, i)
        for j in _meeting(box_o, inner_boxes):
            if cached is None or cached[0] != j:
                cached = None  # drop the old chunk before reading the next
                cached = (j, read_saved_chunk(root_i, inner, j))
            common = box_o.intersect(inner_boxes[j])
            assert common is not None
            # No view of a chunk may outlive this call: it would keep the chunk in memory
            # while the next one is read.
            parts = (_part(data_o, box_o, common), _part(cached[1], inner_boxes[j], common))
            _compare(*(parts[::-1] if swap else parts), common.offsets, atol, rtol, acc)
            del parts
        del data_o
        if on_chunk is not None:
            on_chunk(box_o.numel * a.itemsize)
    if acc.count == 0:
        return None
    return ValueDifference(
        a.fqn, acc.count, math.prod(a.shape), acc.diff, acc.where, acc.a_value, acc.b_value
    )


def _meeting(box: Box, boxes: list[Box]) -> Iterator[int]:
    # A checkpoint has few chunks per tensor (one per saving rank, or a few): testing every
    # pair is cheaper here than building an index.
    for j, other in enumerate(boxes):
        if not other.is_empty and box.intersect(other) is not None:
            yield j


def _part(data: torch.Tensor, box: Box, region: Box) -> torch.Tensor:
    out = data
    for d, (o, s) in enumerate(zip(region.offsets, region.sizes)):
        out = out.narrow(d, o - box.offsets[d], s)
    return out


class _Worst:
    def __init__(self) -> None:
        self.count = 0
        self.diff = -1.0
        self.where: tuple[int, ...] = ()
        self.a_value = ""
        self.b_value = ""


def _slabs(a: torch.Tensor, b: torch.Tensor) -> Iterable[tuple[int, torch.Tensor, torch.Tensor]]:
    if a.dim() == 0 or a.numel() <= BLOCK:
        yield 0, a, b
        return
    rows = max(1, BLOCK // max(1, a[0].numel()))
    for start in range(0, a.shape[0], rows):
        n = min(rows, a.shape[0] - start)
        yield start, a.narrow(0, start, n), b.narrow(0, start, n)


def _compare(
    a: torch.Tensor,
    b: torch.Tensor,
    origin: tuple[int, ...],
    atol: float,
    rtol: float,
    acc: _Worst,
) -> None:
    import torch

    exact = atol == 0 and rtol == 0
    for start, sa, sb in _slabs(a, b):
        if sa.dtype.is_floating_point or sa.dtype.is_complex:
            wide = torch.complex128 if sa.dtype.is_complex else torch.float64
            xa, xb = sa.to(wide), sb.to(wide)
            same = torch.isclose(xa, xb, rtol=rtol, atol=atol, equal_nan=True)
        else:
            xa, xb = sa.to(torch.float64), sb.to(torch.float64)
            same = (sa == sb) if exact else torch.isclose(xa, xb, rtol=rtol, atol=atol)
        differs = ~same
        n = int(differs.sum())
        if n == 0:
            continue
        acc.count += n
        gap = (xa - xb).abs().to(torch.float64)
        # NaN against a number (or inf against inf of the other sign) is as far as it gets.
        gap = torch.where(torch.isnan(gap), torch.full_like(gap, math.inf), gap)
        gap = torch.where(differs, gap, torch.full_like(gap, -1.0))
        flat = int(torch.argmax(gap.reshape(-1)))
        worst = float(gap.reshape(-1)[flat])
        if worst > acc.diff:
            local = _unravel(flat, tuple(sa.shape))
            acc.diff = worst
            acc.where = tuple(
                o + (start if d == 0 else 0) + x for d, (o, x) in enumerate(zip(origin, local))
            )
            acc.a_value = _show(sa[local].item())
            acc.b_value = _show(sb[local].item())


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def _show(v: Any) -> str:
    return repr(v)
