"""The specs area: sharding specs and their inference (SPEC-*, CONVERT-3).

Its tests: ``conformance/tests/test_specs.py``. An adapter takes part by subclassing
:class:`Specs` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Specs(Adapter):
    """Sharding specs and their inference (SPEC-*, CONVERT-3)."""

    area = "specs"

    def infer_chunk(self, layout: Layout) -> tuple[int, list[int]] | None:
        """The (dim, rank order) of the chunk spec inferred from ``layout``, or None when
        the implementation infers an enumerable spec."""
        raise self.unsupported("spec inference")

    def inferred_layout(self, layout: Layout) -> Layout:
        """The layout the spec inferred from ``layout`` gives for ``layout.shape`` (SPEC-3:
        ``infer_spec(L).layout(L.shape)``), ranks included."""
        raise self.unsupported("spec inference")

    def sharding_spec(self, layout: Layout) -> Any:
        """The torch sharding spec (``ChunkShardingSpec`` or ``EnumerableShardingSpec``) the
        implementation converts ``layout`` to (CONVERT-3)."""
        raise self.unsupported("torch sharding specs from a layout")
