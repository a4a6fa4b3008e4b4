"""The chunk area: the chunk rule (CHUNK-*: spec/02-chunk.md).

Its tests: ``conformance/tests/test_chunk.py``. An adapter takes part by subclassing
:class:`Chunk` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Chunk(Adapter):
    """The chunk rule (CHUNK-*: spec/02-chunk.md)."""

    area = "chunk"

    def chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        """The layout of chunking ``dim`` over ``ranks`` (chunk i on ranks[i])."""
        raise self.unsupported("chunk layouts")

    def reshard_chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        """The chunk layout as the implementation's resharding path computes it."""
        raise self.unsupported("reshard chunk layouts")
