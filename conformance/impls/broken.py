"""A deliberately broken implementation, for the suite's own tests only.

It is shardspec with one bug: on a dim that does not divide evenly, every non-empty chunk
after the first starts one element early. The meta tests check that the suite catches it and
that Hypothesis shrinks the failure to a tiny layout.
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.impls.ours import ShardspecImpl
from shardspec.metadata import Box, Layout, Shard


class BrokenImpl(ShardspecImpl):
    name = "broken"

    def chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        good = super().chunk_layout(shape, dim, ranks)
        n = good.shape[dim]
        if n % len(ranks) == 0:
            return good
        shards = []
        for i, s in enumerate(good.shards):
            offsets = list(s.box.offsets)
            if i > 0 and not s.box.is_empty:
                offsets[dim] -= 1
            shards.append(Shard(Box(offsets, s.box.sizes), s.rank))
        return Layout(good.shape, shards)
