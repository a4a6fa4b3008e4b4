"""A deliberately broken implementation, for the suite's own tests only.

It is shardspec with two bugs: on a dim that does not divide evenly, every non-empty chunk
after the first starts one element early; and in refit, the k part of a packed ``qkv_proj``
weight on the first serving rank that holds two or more of its rows is read one row late
(each row holds the next one's values; the last keeps its own), the off-by-one of a packed
layout written by hand. The meta tests check that the suite catches both, and that Hypothesis
shrinks the chunk failure to a tiny layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    def refit(
        self,
        pool: Any,
        recipe: Any,
        rounds: list[dict[str, Any]],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        example: str,
    ) -> list[list[dict[str, list[Any]]]]:
        answers = super().refit(pool, recipe, rounds, src, dst, example=example)
        for per_round in answers:  # the first rank, the first round that has such a k box
            for got in per_round:
                if _shift_k(got):
                    return answers
        return answers


def _shift_k(got: dict[str, list[Any]]) -> bool:
    """Read the k box of a packed qkv weight one row late; whether there was one to shift."""
    import torch

    for name, tensors in got.items():
        # a packed layout's boxes of a rank: q, k, v in part order (REFIT-3)
        if name.endswith("qkv_proj.weight") and len(tensors) == 3 and tensors[1].shape[0] >= 2:
            k = tensors[1]
            # on the bytes: torch's roll does not take every dtype (float8 among them)
            tensors[1] = k.contiguous().view(torch.uint8).roll(-1, 0).view(k.dtype)
            return True
    return False
