"""DTensor placements as plain values: the one placement vocabulary of shardspec, torch-free.

``ShardDim(d)``, ``StridedShardDim(d, split_factor)`` and ``Replicate()`` mirror torch's
``Shard``, ``_StridedShard`` and ``Replicate``; :func:`from_torch` and :func:`to_torch` convert
(importing torch only when called); :func:`placement_to_json` / :func:`placement_from_json`
are their JSON form (``["S", d]``, ``["SS", d, f]``, ``["R"]``, DTENSOR-11). What DTensor makes
of a list of them is :mod:`shardspec.metadata.dtensor_math`'s rule (DTENSOR-*), reached
through :func:`to_split`. The FSDP rules, the TorchRec placements and the conformance codec
use these. (Named ``ShardDim`` because :class:`shardspec.metadata.Shard` is a box on a rank.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dtensor_math import Split
from .errors import LayoutError

__all__ = [
    "Placement",
    "Replicate",
    "ShardDim",
    "StridedShardDim",
    "from_torch",
    "placement_from_json",
    "placement_to_json",
    "to_split",
    "to_torch",
]


@dataclass(frozen=True, slots=True)
class ShardDim:
    """``Shard(dim)``: chunk the current local extent of ``dim`` over the mesh dim. A
    negative ``dim`` counts from the end, as torch's ``Shard(-1)`` (:func:`to_split` resolves
    it against the tensor's number of dims)."""

    dim: int

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise LayoutError(f"ShardDim.dim must be an int, got {self.dim!r}")


@dataclass(frozen=True, slots=True)
class StridedShardDim:
    """``_StridedShard(dim, split_factor)``: split the current extent of ``dim`` into
    ``split_factor`` chunks, chunk each of those over the mesh dim, and give coordinate ``c``
    the ``c``-th piece of every one of them, concatenated. A negative ``dim`` counts from the
    end, as for :class:`ShardDim`."""

    dim: int
    split_factor: int

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise LayoutError(f"StridedShardDim.dim must be an int, got {self.dim!r}")
        if (
            isinstance(self.split_factor, bool)
            or not isinstance(self.split_factor, int)
            or self.split_factor < 1
        ):
            raise LayoutError(
                f"StridedShardDim.split_factor must be a positive int, got {self.split_factor!r}"
            )


@dataclass(frozen=True, slots=True)
class Replicate:
    """``Replicate()``: every coordinate of the mesh dim holds the same data."""


Placement = ShardDim | StridedShardDim | Replicate


def to_split(placement: Placement, ndim: int | None = None) -> Split | None:
    """The placement in ``shardspec.metadata.dtensor_math``'s terms (None for Replicate), so
    one implementation of DTensor's layout rules serves both packages. A negative dim is
    resolved against ``ndim``, the tensor's number of dims (required then)."""
    if isinstance(placement, Replicate):
        return None
    if not isinstance(placement, (ShardDim, StridedShardDim)):
        raise LayoutError(
            f"placement {placement!r} is not a ShardDim, StridedShardDim or Replicate "
            "(convert torch placements with from_torch)"
        )
    dim = placement.dim
    if dim < 0:
        if ndim is None:
            raise LayoutError(
                f"placement {placement!r} counts its dim from the end: give the tensor's ndim"
            )
        if dim + ndim < 0:
            raise LayoutError(f"placement {placement!r} is out of range for a {ndim}-d tensor")
        dim += ndim
    if isinstance(placement, StridedShardDim):
        return Split(dim, placement.split_factor)
    return Split(dim)


def from_torch(placement: Any) -> Placement:
    """Our placement for a torch ``Shard`` / ``_StridedShard`` / ``Replicate``.

    ``Partial`` has no layout (the data is a sum of terms, not a piece) and is refused.
    """
    from torch.distributed.tensor import Replicate as TReplicate, Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(placement, _StridedShard):
        return StridedShardDim(int(placement.dim), int(placement.split_factor))
    if isinstance(placement, TShard):
        return ShardDim(int(placement.dim))
    if isinstance(placement, TReplicate):
        return Replicate()
    raise LayoutError(f"placement {placement!r} has no layout (only Shard/_StridedShard/Replicate)")


def to_torch(placement: Placement) -> Any:
    """The torch placement for one of ours."""
    from torch.distributed.tensor import Replicate as TReplicate, Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(placement, StridedShardDim):
        return _StridedShard(placement.dim, split_factor=placement.split_factor)
    if isinstance(placement, ShardDim):
        return TShard(placement.dim)
    return TReplicate()


def placement_to_json(placement: Placement) -> list[Any]:
    """``["S", dim]``, ``["SS", dim, split_factor]`` or ``["R"]`` (DTENSOR-11)."""
    if isinstance(placement, StridedShardDim):
        return ["SS", placement.dim, placement.split_factor]
    if isinstance(placement, ShardDim):
        return ["S", placement.dim]
    if isinstance(placement, Replicate):
        return ["R"]
    raise LayoutError(
        f"placement {placement!r} is not a ShardDim, StridedShardDim or Replicate "
        "(convert torch placements with from_torch)"
    )


def placement_from_json(obj: Any) -> Placement:
    """The placement of a JSON form; anything else raises :class:`LayoutError` naming it."""
    if isinstance(obj, list) and obj == ["R"]:
        return Replicate()
    if isinstance(obj, list) and len(obj) == 2 and obj[0] == "S":
        return ShardDim(obj[1])
    if isinstance(obj, list) and len(obj) == 3 and obj[0] == "SS":
        return StridedShardDim(obj[1], obj[2])
    raise LayoutError(
        f"bad placement {obj!r}: expected ['S', dim], ['SS', dim, split_factor] or ['R']"
    )
