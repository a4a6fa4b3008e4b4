"""The convert area: converters on real ranks: a ShardedTensor from a layout (CONVERT-*).

Its tests: ``conformance/tests/test_convert.py``. An adapter takes part by subclassing
:class:`Convert` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Convert(Adapter):
    """Converters on real ranks: a ShardedTensor from a layout (CONVERT-*)."""

    area = "convert"

    def sharded_tensor(
        self, pool: Any, layout: Layout, tensor: Any, example: str | None = None
    ) -> list[Any]:
        """A real ShardedTensor on the pool's ranks holding ``layout``'s boxes of ``tensor``:
        per rank, a RankResult with ``value["layout"]`` (its global metadata as layout JSON),
        ``value["local"]`` (its local shards' boxes) and the local shards' data."""
        inputs = [
            [tensor[b.slices()].contiguous() for b in layout.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        from conformance.codec import layout_to_json

        args = {"layout": layout_to_json(layout), "dtype": str(tensor.dtype).removeprefix("torch.")}
        return self._run_via(  # type: ignore[no-any-return]
            "ShardedTensor from a layout",
            pool,
            "convert.sharded_tensor",
            args,
            per_rank_tensors=inputs,
            example=example,
        )
