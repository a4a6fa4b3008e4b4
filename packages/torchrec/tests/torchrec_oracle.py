"""Brute-force oracles for the TorchRec sharding rules: who owns element (i, j).

Written from the rule statements in spec/08-torchrec.md, element by element, without any
interval arithmetic, so that they share no code or shortcut with shardspec.torchrec.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardspec.metadata import Layout


def owners_of(layout: Layout) -> dict[tuple[int, int], set[int]]:
    """Element -> set of ranks whose box holds it, by testing every element of every box."""
    rows, cols = layout.shape
    out: dict[tuple[int, int], set[int]] = {(i, j): set() for i in range(rows) for j in range(cols)}
    for s in layout.shards:
        for i in range(rows):
            for j in range(cols):
                if s.box.contains_point((i, j)):
                    out[(i, j)].add(s.rank)
    return out


def brute_block_width(cols: int, lower: int) -> int:
    """The smallest w >= lower with w % 4 == 0 and cols % w == 0, below cols; else cols."""
    w = lower
    while w < cols:
        if w % 4 == 0 and cols % w == 0:
            return w
        w += 1
    return cols


def chunk_owner_index(i: int, n: int, k: int) -> int:
    """Which of k torch.chunk pieces of range(n) holds i (by listing the pieces)."""
    size = -(-n // k)
    pieces = [list(range(n))[p : p + size] for p in range(0, n, size)] if n else []
    for idx, piece in enumerate(pieces):
        if i in piece:
            return idx
    raise AssertionError(f"{i} not in range({n})")


def cumulative_owner_index(i: int, sizes: Sequence[int]) -> int:
    """Which block of consecutive runs of sizes[0], sizes[1], ... holds position i."""
    flat = [b for b, s in enumerate(sizes) for _ in range(s)]
    return flat[i]
