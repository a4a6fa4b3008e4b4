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


# What the pool's error says of the other ranks (shardspec.testing.dispatch): "...; rank 1
# still waiting in a collective after 1.0 s" (or "ranks [1, 2] ..."), and "ranks [1] stopped
# before the collective because of the above" (another rank's check failed).
_WAITING = re.compile(
    r"(?:\brank (\d+)|\branks \[([\d, ]+)\]) still waiting in a collective after ([\d.]+) s$",
    re.MULTILINE,
)
_ABORTED = re.compile(r"\branks \[([\d, ]+)\] stopped before the collective")


def split_refusal(error: Any, world: int) -> dict[int, str]:
    """Per rank, what it did in a pool call that raised ``RankError``: ``raised T: message``,
    ``still waiting in a collective after N s`` (the pool restarted it), or ``returned``."""
    out = dict.fromkeys(range(world), "returned")
    text = str(error)
    waiting = _WAITING.findall(text)
    if waiting:  # the pool's own line is the last: a rank's message may quote anything
        one, several, secs = waiting[-1]
        for r in [int(one)] if one else [int(x) for x in several.split(",")]:
            out[r] = f"still waiting in a collective after {secs} s"
    m = _ABORTED.search(text)
    for r in [int(x) for x in m.group(1).split(",")] if m else []:
        out[r] = "stopped before the collective (another rank's check failed)"
    for f in error.failures:
        first = f.message.strip().splitlines()[0] if f.message.strip() else ""
        out[f.rank] = f"raised {f.type_name.rsplit('.', 1)[-1]}: {first[:300]}"
    return out


def describe_split(outcomes: dict[int, str]) -> str:
    return "; ".join(f"rank {r} {what}" for r, what in sorted(outcomes.items()))
