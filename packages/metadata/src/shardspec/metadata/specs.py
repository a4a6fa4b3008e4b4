"""Sharding specs: a rule that gives a layout for a shape.

Two kinds, mirroring torch's ``ChunkShardingSpec`` and ``EnumerableShardingSpec`` but without
devices or process groups: :class:`ChunkSpec` (the ``torch.chunk`` rule along one dim, chunk
``i`` on ``ranks[i]``) and :class:`EnumerableSpec` (an explicit, validated layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .box import as_index, as_index_tuple, show_ints
from .chunk import chunk_layout
from .errors import LayoutError, shorten
from .layout import Layout

__all__ = ["ChunkSpec", "EnumerableSpec", "Spec"]


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """Chunk dim ``dim`` with the ``torch.chunk`` rule; chunk ``i`` goes to ``ranks[i]``.

    ``dim`` may be negative (counted from the end, as in torch) until a shape is known;
    :func:`~shardspec.metadata.infer_spec` always returns a non-negative dim.
    """

    dim: int
    ranks: tuple[int, ...]

    def __init__(self, dim: int, ranks: Sequence[int]) -> None:
        dim = as_index(dim, "ChunkSpec dim")
        rks = as_index_tuple(ranks, "ChunkSpec ranks")
        if not rks:
            raise LayoutError("ChunkSpec needs at least one rank")
        if len(set(rks)) != len(rks):
            raise LayoutError(
                f"ChunkSpec ranks {shorten(rks)} name a rank twice; each rank holds one chunk"
            )
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "ranks", rks)

    def layout(self, shape: Sequence[int]) -> Layout:
        """``chunk_layout(shape, dim, ranks)``."""
        return chunk_layout(shape, self.dim, self.ranks)


@dataclass(frozen=True, slots=True)
class EnumerableSpec:
    """An explicit layout. It is validated on construction and only describes its own shape."""

    enumerated: Layout

    def __init__(self, layout: Layout) -> None:
        if not isinstance(layout, Layout):
            raise LayoutError(f"EnumerableSpec needs a Layout, got {shorten(layout)}")
        layout.validate()
        object.__setattr__(self, "enumerated", layout)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.enumerated.shape

    def layout(self, shape: Sequence[int]) -> Layout:
        """The enumerated layout; ``shape`` must be the shape it was written for."""
        shp = as_index_tuple(shape, "shape")
        if shp != self.enumerated.shape:
            raise LayoutError(
                f"EnumerableSpec was written for shape {self.enumerated.shape}, "
                f"not {show_ints(shp)}: an enumerated layout does not rescale"
            )
        return self.enumerated

    def __repr__(self) -> str:
        return f"EnumerableSpec({self.enumerated!r})"


Spec = ChunkSpec | EnumerableSpec
