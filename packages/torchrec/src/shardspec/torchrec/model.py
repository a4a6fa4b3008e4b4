"""Resharding a live TorchRec model between two sharding plans, in memory (TORCHREC-16..18).

1. :func:`read_state` reads a model's state dict as ``{key: TableState(layout, shards)}``:
   a ``ShardedTensor`` by its global metadata, a TorchRec DTensor by its wrappers' offsets
   (gathered: the placements do not describe every type), a plain tensor as replicated on
   every rank (data-parallel tables, dense parameters).
2. :func:`reshard_model` reads the source and the destination model, plans every table with
   :func:`shardspec.reshard.plan` and moves all of them together with
   :func:`shardspec.reshard.reshard_state_dict` (one ``all_to_all_single`` per round for the
   whole model), receiving straight into the destination model's own tensors (the storage
   behind its state dict, e.g. the fused kernel's weights) where that is safe, and into new
   tensors that are then copied into the model elsewhere.
3. :func:`load_state` loads ``TableState``\\ s into a model, refusing (on every rank alike)
   any table whose layout is not the model's.

No file is written. Call every function on every rank of the group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from shardspec.metadata import Box, ConversionError, Layout, Shard
from shardspec.reshard import ReshardError, reshard_state_dict

from .keys import FORMS, resolve_tables, same_table

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["TableState", "load_state", "read_state", "reshard_model", "reshard_states"]


class TableState(NamedTuple):
    """A tensor's layout and this rank's shards of it, in the layout's local order."""

    layout: Layout
    shards: list[torch.Tensor]


def _rank_mapper(own: dist.ProcessGroup | None, group: dist.ProcessGroup | None) -> Any:
    """Ranks of ``own`` (a ShardedTensor's process group: its placements name ranks there)
    as ranks of ``group``."""
    import torch.distributed as dist

    def is_world(g: dist.ProcessGroup | None) -> bool:
        return g is None or g is dist.group.WORLD

    def to_group(r: int) -> int:
        g = r if is_world(own) else dist.get_global_rank(own, r)  # type: ignore[arg-type]
        if is_world(group):
            return g
        out = dist.get_group_rank(group, g)  # type: ignore[arg-type]
        if out < 0:
            raise ConversionError(f"global rank {g} holds a shard but is not in the group")
        return out

    return to_group


def _sharded_tensor_state(value: Any, group: dist.ProcessGroup | None, rank: int) -> TableState:
    from .plans import placement_rank

    md = value.metadata()
    to_group = _rank_mapper(getattr(value, "_process_group", None), group)
    shards = [
        Shard(
            Box(list(m.shard_offsets), list(m.shard_sizes)), to_group(placement_rank(m.placement))
        )
        for m in md.shards_metadata
    ]
    layout = Layout(tuple(md.size), shards)
    local = {
        (tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)): s.tensor
        for s in value.local_shards()
    }
    mine = []
    for b in layout.boxes_of(rank):
        t = local.get((b.offsets, b.sizes))
        if t is None:
            raise ConversionError(
                f"the ShardedTensor's metadata puts {b} on rank {rank} but its local shards are "
                f"{sorted(local)}"
            )
        mine.append(t)
    return TableState(layout, mine)


def read_state(
    module_or_state: Any,
    group: dist.ProcessGroup | None = None,
    *,
    keys: Iterable[str] | None = None,
) -> dict[str, TableState]:
    """``{key: TableState}`` for a model (or its ``state_dict()``), on every rank of ``group``.

    Layout ranks are ranks within ``group``. Plain tensors are taken as replicated on every
    rank of the group. ``keys`` restricts the result (default: every tensor); a table may be
    named by its state-dict key, its module path with the table (``"ebc.t0"``) or its name
    (TORCHREC-19), and the result is keyed by state-dict key. A collective when the state
    holds DTensors.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor

    from .dtensor import as_wrapper, gather_layout

    state = (
        module_or_state.state_dict() if hasattr(module_or_state, "state_dict") else module_or_state
    )
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    if keys is None:
        wanted = sorted(state)
    else:
        wanted = sorted(set(resolve_tables(keys, state, what="state dict's keys").values()))
    out: dict[str, TableState] = {}
    for key in wanted:
        value = state[key]
        if isinstance(value, ShardedTensor):
            out[key] = _sharded_tensor_state(value, group, rank)
        elif isinstance(value, DTensor):
            layout = gather_layout(value, group=group)
            out[key] = TableState(layout, list(as_wrapper(value).local_shards()))
        elif isinstance(value, torch.Tensor):
            out[key] = TableState(Layout.replicated(tuple(value.shape), range(world)), [value])
    return out


def _check_same_tables(src: Mapping[str, TableState], dst: Mapping[str, TableState]) -> None:
    if set(src) != set(dst):
        raise ReshardError(
            f"the models hold different tensors: only in the source {sorted(set(src) - set(dst))}, "
            f"only in the destination {sorted(set(dst) - set(src))}"
        )
    for key in sorted(src):
        if src[key].layout.shape != dst[key].layout.shape:
            raise ReshardError(
                f"{key}: the source has shape {src[key].layout.shape} but the destination "
                f"{dst[key].layout.shape}"
            )


def reshard_states(
    src: Mapping[str, TableState],
    dst_layouts: Mapping[str, Layout],
    group: dist.ProcessGroup | None = None,
    *,
    max_buffer_bytes: int | None = None,
) -> dict[str, TableState]:
    """This rank's shards of every tensor in its destination layout (no model needed), keyed
    as ``src``; ``dst_layouts`` may name the tables in any of the three forms (TORCHREC-19),
    e.g. as :func:`layouts_from_plan` keys them, and must name each of ``src``'s."""
    extra = [k for k in dst_layouts if not any(same_table(k, s) for s in src)]
    missing = [s for s in src if not any(same_table(k, s) for k in dst_layouts)]
    if extra or missing:
        raise ReshardError(
            f"the source and dst_layouts hold different tables: no layout for {sorted(missing)}, "
            f"no source for {sorted(extra)} (tables named by {FORMS})"
        )
    to_src = resolve_tables(dst_layouts, src, what="source tables")
    dst = {to_src[k]: layout for k, layout in dst_layouts.items()}
    moved = reshard_state_dict(
        {k: s.shards for k, s in src.items()},
        {k: s.layout for k, s in src.items()},
        dst,
        group,
        max_buffer_bytes=max_buffer_bytes,
    )
    return {k: TableState(dst[k], v) for k, v in moved.items()}


def load_state(
    module_or_state: Any,
    states: Mapping[str, TableState],
    group: dist.ProcessGroup | None = None,
) -> None:
    """Copy ``states`` into a model's own tensors; every layout must be the model's.

    A table whose layout differs from the model's raises :class:`ReshardError` on every rank
    (the layouts are global facts, so all ranks see the same mismatch) before anything is
    copied. ``states`` may name tables in any of the three forms (TORCHREC-19).
    """
    target = read_state(module_or_state, group, keys=states.keys())
    to_key = resolve_tables(states, target, what="model's tables")
    _copy_into(target, {to_key[k]: v for k, v in states.items()})


def _copy_into(target: Mapping[str, TableState], states: Mapping[str, TableState]) -> None:
    import torch

    for key in sorted(states):
        have, given = target[key].layout, states[key].layout
        if have != given:
            raise ReshardError(
                f"cannot load {key!r}: the model holds it as {have} but the shards given are "
                f"laid out as {given}; reshard them to the model's layout first"
            )
    for key in sorted(states):
        dst, src = target[key].shards, states[key].shards
        if len(dst) != len(src):
            raise ReshardError(f"{key}: {len(src)} shards given for {len(dst)} local boxes")
        with torch.no_grad():
            for i, (d, s) in enumerate(zip(dst, src)):
                if d.shape != s.shape:
                    raise ReshardError(
                        f"{key}: local shard #{i} has shape {tuple(s.shape)}, the model's "
                        f"{tuple(d.shape)}"
                    )
                d.copy_(s)


def _storages(module: Any) -> set[int] | None:
    """Data pointers of the storages behind a module's parameters and buffers (non-persistent
    ones too: the fused kernel keeps its weights there), or None for a bare state dict."""
    import itertools

    if not hasattr(module, "parameters") or not hasattr(module, "buffers"):
        return None
    ptrs = set()
    for t in itertools.chain(module.parameters(), module.buffers()):
        try:
            ptrs.add(t.untyped_storage().data_ptr())
        except Exception:  # a wrapper subclass (ShardedTensor, DTensor) has no storage
            continue
    return ptrs


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:
        return None


def _in_place_keys(
    src: Mapping[str, TableState],
    dst: Mapping[str, TableState],
    dst_module: Any,
    group: dist.ProcessGroup | None,
) -> set[str]:
    """The tables whose destination tensors can receive the reshard directly, agreed by every
    rank (the executor needs the same keys with ``out`` everywhere).

    A table qualifies when, on every rank, each destination tensor is a plain tensor that
    writes through to the model (its storage is one of the model's parameters or buffers: a
    state dict may hold copies, which would leave the weights unchanged), shares no storage
    with a source tensor (the reshard must not read what it has written) and has the source
    dtype and the tensors' device (the executor writes in the source dtype).
    """
    import torch
    import torch.distributed as dist

    from shardspec.reshard.agreement import dtype_code

    keys = sorted(dst)
    if not keys:
        return set()
    owned = _storages(dst_module)
    src_ptrs = {_storage_ptr(t) for st in src.values() for t in st.shards}
    devices = {t.device for st in (*src.values(), *dst.values()) for t in st.shards}
    device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")

    def code(ts: list[torch.Tensor]) -> int:
        try:
            return dtype_code(ts[0].dtype) if ts else 0
        except ReshardError:
            return -1

    # Per key: [refused here, source dtype code, destination dtype code]; MAX over the group.
    rows = []
    for k in keys:
        refused = len(devices) > 1
        for t in dst[k].shards:
            if t.numel() == 0:
                continue  # nothing is written into it
            ptr = _storage_ptr(t)
            plain = type(t) in (torch.Tensor, torch.nn.Parameter)
            foreign = owned is not None and ptr not in owned
            if not plain or ptr is None or ptr in src_ptrs or foreign:
                refused = True
        s_code, d_code = code(src[k].shards), code(dst[k].shards)
        if -1 in (s_code, d_code) or len({t.dtype for t in dst[k].shards}) > 1:
            refused = True
        rows.append([int(refused), s_code, d_code])
    flags = torch.tensor(rows, dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return {
        k
        for k, (refused, s_code, d_code) in zip(keys, flags.tolist())
        if not refused and (s_code == d_code or 0 in (s_code, d_code))
    }


def reshard_model(
    src: Any,
    dst: Any,
    group: dist.ProcessGroup | None = None,
    *,
    keys: Iterable[str] | None = None,
    max_buffer_bytes: int | None = None,
) -> dict[str, tuple[Layout, Layout]]:
    """Copy the source model's tensors into the destination model, sharded by another plan.

    Both models hold the same tensors (keys and shapes; ``keys`` restricts to some) under any
    two plans: other sharding types, rank order, number of ranks used. Returns
    ``{key: (source layout, destination layout)}``.

    The destination's weights are written in place: tables whose state dict tensors write
    through to the model receive the data directly (no second copy of the model in memory);
    the others receive into new tensors copied into the model afterwards.
    """
    key_list = None if keys is None else sorted(keys)
    src_states = read_state(src, group, keys=key_list)
    dst_states = read_state(dst, group, keys=key_list)
    _check_same_tables(src_states, dst_states)
    direct = _in_place_keys(src_states, dst_states, dst, group)
    dst_layouts = {k: s.layout for k, s in dst_states.items()}
    if direct:
        reshard_state_dict(
            {k: src_states[k].shards for k in sorted(direct)},
            {k: src_states[k].layout for k in sorted(direct)},
            {k: dst_layouts[k] for k in sorted(direct)},
            group,
            max_buffer_bytes=max_buffer_bytes,
            out={k: dst_states[k].shards for k in sorted(direct)},
        )
    rest = sorted(set(src_states) - direct)
    if rest:
        moved = reshard_states(
            {k: src_states[k] for k in rest},
            {k: dst_layouts[k] for k in rest},
            group,
            max_buffer_bytes=max_buffer_bytes,
        )
        _copy_into({k: dst_states[k] for k in rest}, moved)
    return {k: (src_states[k].layout, dst_states[k].layout) for k in sorted(src_states)}
