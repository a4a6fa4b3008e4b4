"""TorchRec's ``ParameterSharding`` / ``ShardingPlan`` <-> :class:`Layout`.

Reading is duck-typed (attributes only), so it works on TorchRec's objects without importing
TorchRec here; writing a ``ParameterSharding`` imports TorchRec when called.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from shardspec.metadata import Box, ConversionError, Layout, Shard

from .keys import resolve_table
from .layouts import _table_shape

__all__ = [
    "layout_from_parameter_sharding",
    "layouts_from_plan",
    "placement_rank",
    "to_parameter_sharding",
]

_RANK = re.compile(r"^rank:(\d+)/")


def placement_rank(placement: Any) -> int:
    """The rank of a ShardMetadata placement (a ``_remote_device`` or ``"rank:R/device"``)."""
    rank_fn = getattr(placement, "rank", None)
    if callable(rank_fn):
        r = rank_fn()
        if isinstance(r, int) and r >= 0:
            return r
    m = _RANK.match(str(placement))
    if m is None:
        raise ConversionError(f"placement {placement!r} names no rank ('rank:R/device' expected)")
    return int(m.group(1))


def layout_from_parameter_sharding(
    param_sharding: Any, shape: Sequence[int], *, world_size: int | None = None
) -> Layout:
    """The layout TorchRec's ``ParameterSharding`` gives a table of ``shape`` (TORCHREC-10).

    Boxes come from ``sharding_spec.shards`` (offsets, sizes), owners from their placements,
    in that order. ``ranks``, when set, must name the same owners in the same order (TorchRec
    places by ``ranks`` but writes state dicts by placement, so a disagreement means the table
    is not where its checkpoint says). data_parallel has no spec: its owners are ``ranks``, or
    ``range(world_size)``.
    """
    rows, cols = _table_shape(shape)
    stype = getattr(param_sharding.sharding_type, "value", param_sharding.sharding_type)
    ranks = list(param_sharding.ranks) if param_sharding.ranks is not None else None
    spec = param_sharding.sharding_spec
    if stype == "data_parallel":
        if ranks is None:
            if world_size is None:
                raise ConversionError(
                    "data_parallel ParameterSharding has no ranks; pass world_size"
                )
            ranks = list(range(world_size))
        return Layout.replicated((rows, cols), ranks)
    if spec is None or not hasattr(spec, "shards"):
        raise ConversionError(
            f"{stype} ParameterSharding has sharding_spec {spec!r}; an EnumerableShardingSpec "
            f"with the table's shards is needed"
        )
    shards = []
    for i, md in enumerate(spec.shards):
        box = Box(list(md.shard_offsets), list(md.shard_sizes))
        shards.append(Shard(box, placement_rank(md.placement)))
        if ranks is not None and (i >= len(ranks) or ranks[i] != shards[-1].rank):
            raise ConversionError(
                f"{stype} ParameterSharding: shard #{i} {box} is placed on rank "
                f"{shards[-1].rank} but ranks {ranks} say "
                f"{ranks[i] if i < len(ranks) else 'nothing'}"
            )
    if ranks is not None and len(ranks) != len(shards):
        raise ConversionError(
            f"{stype} ParameterSharding: {len(shards)} shards but ranks {ranks} name {len(ranks)}"
        )
    return Layout((rows, cols), shards)


def layouts_from_plan(
    plan: Any, shapes: Mapping[str, Sequence[int]], *, world_size: int | None = None
) -> dict[str, Layout]:
    """``{key: Layout}`` for every table of a TorchRec ``ShardingPlan`` (TORCHREC-10, -19).

    ``shapes`` gives ``(rows, cols)`` per table (a plan carries no shapes), each table named
    by its module path and name (``"ebc.t0"``), its name alone (``"t0"``) or its state-dict key
    (``"ebc.embedding_bags.t0.weight"``). A table is keyed in the result as ``shapes`` names
    it, and as ``"<module path>.<table>"`` where ``shapes`` gives its name alone: shapes read
    from ``read_state`` give layouts keyed by state-dict keys, ready for ``reshard_states``.
    A table with no shape, or a name that fits several, raises :class:`ConversionError`.
    """
    out: dict[str, Layout] = {}
    for module_path, module_plan in plan.plan.items():
        for table, ps in module_plan.items():
            key = f"{module_path}.{table}" if module_path else table
            try:
                given = resolve_table(key, shapes, what="keys of shapes")
            except ConversionError as e:
                raise ConversionError(f"no shape for table {key!r} of the plan: {e}") from e
            if "." in given:  # a module path or a state-dict key: keep the caller's form
                key = given
            out[key] = layout_from_parameter_sharding(ps, shapes[given], world_size=world_size)
    return out


def to_parameter_sharding(
    layout: Layout, sharding_type: Any, *, compute_kernel: str = "fused", device: str = "cpu"
) -> Any:
    """A TorchRec ``ParameterSharding`` that places ``layout``'s boxes (needs TorchRec).

    The shards are written in ``layout.shards`` order, ``ranks`` alongside. data_parallel
    must be the whole table on ranks ``0..W-1``. Whether TorchRec's sharder for
    ``sharding_type`` accepts the placement is up to TorchRec (row_wise wants ranks 0..W-1).
    """
    from torchrec.distributed.types import (
        EnumerableShardingSpec,
        ParameterSharding,
        ShardMetadata,
    )

    layout.validate()
    stype = getattr(sharding_type, "value", sharding_type)
    if stype == "data_parallel":
        ranks = [s.rank for s in layout.shards]
        full = Box.full(layout.shape)
        if sorted(ranks) != list(range(len(ranks))) or any(s.box != full for s in layout.shards):
            raise ConversionError(
                f"data_parallel needs the whole table on ranks 0..W-1, got {layout}"
            )
        return ParameterSharding(
            sharding_type=stype,
            compute_kernel="dense",
            ranks=sorted(ranks),
            sharding_spec=None,
        )
    spec = EnumerableShardingSpec(
        [
            ShardMetadata(
                shard_offsets=list(s.box.offsets),
                shard_sizes=list(s.box.sizes),
                placement=f"rank:{s.rank}/{device}",
            )
            for s in layout.shards
        ]
    )
    return ParameterSharding(
        sharding_type=stype,
        compute_kernel=compute_kernel,
        ranks=[s.rank for s in layout.shards],
        sharding_spec=spec,
    )
