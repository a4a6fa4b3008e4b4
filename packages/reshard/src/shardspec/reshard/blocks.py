"""Row-major element ranges of a box as a few sub-boxes (so a range can be copied as views)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["flat_blocks"]

Block = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes), relative to the box


def flat_blocks(sizes: Sequence[int], lo: int, hi: int) -> list[Block]:
    """Elements ``[lo, hi)`` of a box of ``sizes`` in row-major order, as at most
    ``2 * ndim - 1`` sub-boxes listed in that order.

    The rounds of a bounded-memory reshard cut a piece at arbitrary element positions; this
    turns such a cut into strided views, so no piece is ever copied whole to reach its middle.
    """
    sizes = tuple(sizes)
    if lo >= hi:
        return []
    if not sizes:
        return [((), ())]
    inner = math.prod(sizes[1:])
    r0, q0 = divmod(lo, inner)
    r1, q1 = divmod(hi, inner)
    rest = (0,) * (len(sizes) - 1)
    if r0 == r1:
        return [((r0, *o), (1, *s)) for o, s in flat_blocks(sizes[1:], q0, q1)]
    out: list[Block] = []
    if q0:
        out += [((r0, *o), (1, *s)) for o, s in flat_blocks(sizes[1:], q0, inner)]
        r0 += 1
    if r1 > r0:
        out.append(((r0, *rest), (r1 - r0, *sizes[1:])))
    if q1:
        out += [((r1, *o), (1, *s)) for o, s in flat_blocks(sizes[1:], 0, q1)]
    return out
