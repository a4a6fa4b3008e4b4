"""The checkpoint_files area: DCP checkpoints saved on one pool and loaded on another (CKPT-4,
CKPT-16, CKPT-21).

Its tests: ``conformance/tests/test_checkpoint.py``,
``conformance/tests/test_checkpoint_files.py``. An adapter takes part by subclassing
:class:`CheckpointFiles` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`. Its helpers are what the area's adapters share: the
grid a case draws, as entries ``[rank, offsets, sizes, replica_id, cell]``, and what each rank
did in a pool call that raised.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from conformance.interface.base import Adapter, dtype_name, ones_of
from shardspec.metadata import Box, Layout

__all__ = ["CheckpointFiles", "chunk_bounds", "describe_split", "grid_entries", "split_refusal"]


class CheckpointFiles(Adapter):
    """DCP checkpoints saved on one pool and loaded on another (CKPT-4, CKPT-16, CKPT-21)."""

    area = "checkpoint_files"

    def checkpoint_round_trip(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        example: str,
    ) -> list[Any]:
        """A real ``dcp.save`` on ``save_pool``'s ranks of a ShardedTensor holding ``saved``'s
        boxes of ``tensor``, then a real ``dcp.load`` on ``load_pool``'s ranks into ``load``:
        ``{"kind": "sharded", "layout": JSON}`` (a ShardedTensor) or ``{"kind": "dtensor",
        "mesh": [...], "placements": [...]}``, every element filled with 1 beforehand. Per
        load rank a RankResult whose tensors are its local tensors after the load."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="shardspec-ckpt-") as path:
            self._dcp_save(save_pool, path, saved, tensor, example)
            load_args = {**load, "path": path, "dtype": dtype_name(tensor), "fill": 1,
                         "shape": list(tensor.shape)}  # fmt: skip
            return self._run_via(  # type: ignore[no-any-return]
                "DCP load", load_pool, "checkpoint.load", load_args,
                per_rank_tensors=ones_of(load, tensor, load_pool.world_size), example=example,
            )  # fmt: skip

    def checkpoint_grid_round_trip(
        self,
        save_pool: Any,
        load_pool: Any,
        parts: Sequence[int],
        copies: int,
        form: str,
        tensor: Any,
        load: dict[str, Any],
        example: str,
    ) -> list[Any]:
        """:meth:`checkpoint_round_trip` of the grid of ``parts[d]`` chunks per dim (the chunk
        rule), saved ``copies`` times (rank ``copy * cells + cell``), described in ``form``:
        ``boxes`` (each rank's boxes), or the peers' grid forms ``rank_offsets`` and ``grid``
        (Megatron's ``from_rank_offsets`` and ``axis_fragmentations``)."""
        if form != "boxes":
            raise self.unsupported(
                f"the peers' grid form {form!r} (Megatron's from_rank_offsets, "
                "axis_fragmentations): this implementation describes a layout by its boxes, "
                "which the 'boxes' form runs"
            )
        if copies > 1:
            raise self.unsupported(
                "saving replicas of a ShardedTensor box (torch's ShardedTensor holds each box "
                "once; replicated DTensors are loaded by test_checkpoint.py's round trips)"
            )
        from shardspec.metadata import Shard

        shape = tuple(tensor.shape)
        # identical (empty) cells once: torch's ShardedTensor calls two of them an overlap
        # (validation-identical-empty-boxes-need-a-third); either holds nothing
        first: dict[Box, list[Any]] = {}
        for e in grid_entries(shape, parts, copies):
            first.setdefault(Box(e[1], e[2]), e)
        saved = Layout(shape, [Shard(b, e[0]) for b, e in first.items()])
        return self.checkpoint_round_trip(save_pool, load_pool, saved, tensor, load, example)

    def checkpoint_save_outcomes(
        self, pool: Any, saved: Layout, tensor: Any, path: str, example: str
    ) -> dict[int, str]:
        """Save ``saved`` (maybe invalid) of ``tensor`` to ``path`` on the pool's ranks with
        the implementation's own save: per rank ``returned``, ``raised T: message`` or
        ``still waiting in a collective ...`` (the pool restarted it)."""
        from conformance.codec import layout_to_json
        from shardspec.testing import RankError

        args = {"path": path, "layout": layout_to_json(saved),
                "dtype": str(tensor.dtype).removeprefix("torch.")}  # fmt: skip
        inputs = [
            [tensor[b.slices()].contiguous() for b in saved.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        try:
            self._run_via("DCP save", pool, "checkpoint.save", args,
                          per_rank_tensors=inputs, example=example)  # fmt: skip
        except RankError as e:
            return split_refusal(e, pool.world_size)
        return dict.fromkeys(range(pool.world_size), "returned")

    def checkpoint_load_outcomes(
        self, pool: Any, path: str, layout: Layout, tensor: Any, example: str
    ) -> dict[int, str]:
        """Load the checkpoint at ``path`` (of ``tensor``, maybe damaged) into ``layout`` on
        the pool's ranks with the implementation's own load: per rank as
        :meth:`checkpoint_save_outcomes`."""
        import torch

        from conformance.codec import layout_to_json
        from shardspec.testing import RankError

        args = {"kind": "sharded", "layout": layout_to_json(layout), "path": path,
                "dtype": str(tensor.dtype).removeprefix("torch."), "fill": 1,
                "shape": list(tensor.shape)}  # fmt: skip
        one = torch.ones((), dtype=tensor.dtype)
        inputs = [
            [one.expand(b.sizes).contiguous() for b in layout.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        try:
            self._run_via("DCP load", pool, "checkpoint.load", args,
                          per_rank_tensors=inputs, example=example)  # fmt: skip
        except RankError as e:
            return split_refusal(e, pool.world_size)
        return dict.fromkeys(range(pool.world_size), "returned")

    def peer_checkpoint(
        self, pool: Any, saved: Layout, tensor: Any, path: str, example: str
    ) -> None:
        """A peer's own save of ``saved`` to ``path``, in DCP's file format, for shardspec's
        tools to read (CKPT-21)."""
        raise self.unsupported(
            "a peer's checkpoint: this implementation writes DCP's own checkpoints, which "
            "test_checkpoint.py's round trips load"
        )


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
