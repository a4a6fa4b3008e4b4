"""The torchrec area: TorchRec's sharding types and LocalShardsWrapper (TORCHREC-*:
spec/08-torchrec.md).

Its tests: ``conformance/tests/test_torchrec.py``. An adapter takes part by subclassing
:class:`TorchRec` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Box, Layout


class TorchRec(Adapter):
    """TorchRec's sharding types and LocalShardsWrapper (TORCHREC-*: spec/08-torchrec.md)."""

    area = "torchrec"

    def torchrec_layout(
        self,
        sharding_type: str,
        shape: Sequence[int],
        world_size: int,
        local_size: int,
        params: dict[str, Any],
    ) -> Layout:
        """The layout of one ``(rows, cols)`` table under ``sharding_type`` with the plan helper's
        default block sizes, on ``world_size`` ranks of ``local_size`` per host. ``params`` are
        the helper's: ``rank`` (table_wise), ``ranks`` (column_wise, table_column_wise, with
        ``block_size`` for the latter), ``host_index`` (table_row_wise), ``host_indexes``
        (grid_shard). Raises ValueError when the implementation refuses the description."""
        raise self.unsupported("TorchRec layouts")

    def shards_wrapper(
        self, shards: Sequence[Any], offsets: Sequence[Sequence[int]]
    ) -> tuple[tuple[int, ...], list[Box]]:
        """(shape, DCP chunk boxes) of the implementation's LocalShardsWrapper holding
        ``shards`` at ``offsets``; raises ValueError (or AssertionError) when it refuses them."""
        raise self.unsupported("LocalShardsWrapper")

    def wrapper_object(self, shards: Sequence[Any], offsets: Sequence[Sequence[int]]) -> Any:
        """The implementation's LocalShardsWrapper itself, holding ``shards`` at ``offsets``
        (it has ``local_shards()``), for the ops a checkpoint load and an optimizer apply."""
        raise self.unsupported("LocalShardsWrapper")
