"""What the checkpoint-files cases (``conformance/tests/test_checkpoint_files.py``) share
between adapters: the grid a case draws, as entries ``[rank, offsets, sizes, replica_id,
cell]``, and what each rank did in a pool call that raised."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["chunk_bounds", "describe_split", "grid_entries", "split_refusal"]


def chunk_bounds(n: int, k: int, i: int) -> tuple[int, int]:
    """The chunk rule (CHUNK-1): chunk ``i`` of ``k`` of a dim of ``n``."""
    split = -(-n // k) if k else 0
    return min(i * split, n), min((i + 1) * split, n)


def grid_entries(shape: Sequence[int], parts: Sequence[int], copies: int) -> list[list[Any]]:
    """The grid of ``parts[d]`` chunks per dim (the chunk rule), ``copies`` times: rank
    ``copy * cells + cell`` (cells row-major) holds that cell, ``replica_id`` its copy."""
    cells = list(itertools.product(*(range(p) for p in parts)))
    out: list[list[Any]] = []
    for copy in range(copies):
        for c, cell in enumerate(cells):
            bounds = [chunk_bounds(n, p, i) for n, p, i in zip(shape, parts, cell)]
            offsets = [a for a, _ in bounds]
            sizes = [b - a for a, b in bounds]
            out.append([copy * len(cells) + c, offsets, sizes, copy, list(cell)])
    return out


_WAITING = re.compile(r"ranks \[([\d, ]+)\] were left waiting in the collective")
_ABORTED = re.compile(r"ranks \[([\d, ]+)\] stopped before the collective")


def split_refusal(error: Any, world: int) -> dict[int, str]:
    """Per rank, what it did in a pool call that raised ``RankError``: ``raised T: message``,
    ``still waiting in a collective`` (the pool restarted it), or ``returned``."""
    out = dict.fromkeys(range(world), "returned")
    for pattern, what in (
        (_WAITING, "still waiting in a collective until the pool killed it"),
        (_ABORTED, "stopped before the collective (another rank's check failed)"),
    ):
        m = pattern.search(str(error))
        for r in [int(x) for x in m.group(1).split(",")] if m else []:
            out[r] = what
    for f in error.failures:
        first = f.message.strip().splitlines()[0] if f.message.strip() else ""
        out[f.rank] = f"raised {f.type_name.rsplit('.', 1)[-1]}: {first[:300]}"
    return out


def describe_split(outcomes: dict[int, str]) -> str:
    return "; ".join(f"rank {r} {what}" for r, what in sorted(outcomes.items()))
