"""The exchange of ``reads="once"`` (CKPT-24): the runs each rank read, delivered to every
rank's destinations, and the stored bytes of non-tensor values to every rank.

The executor moves the tensors of one device per rank, and an NCCL group moves CUDA tensors
only, while the runs are read into host memory and a destination may be anywhere (a CPU state
dict loaded over NCCL, CUDA tensors over gloo). So the runs move to the exchange's device, and
a destination on another device receives into a staging tensor there, copied in after. Under
NCCL the keys go in batches of at most :data:`STAGE_BYTES` a rank (counted from the layouts,
so every rank cuts the same batches): a CPU state dict never lands on the GPU whole.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardspec.metadata import Box, Layout, Shard
from shardspec.metadata.dtensor_math import mesh_layout

from .load_reads import Run

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = [
    "BYTES_KEY",
    "STAGE_BYTES",
    "Target",
    "batches",
    "exchange",
    "replicated",
    "whole_on_every_rank",
]

# The stored bytes of non-tensor values travel under these keys, which no fqn starts with.
BYTES_KEY = "\0bytes:"
# Runs and staged destinations one exchange of a batch may hold on the GPU, per rank.
STAGE_BYTES = 1 << 30


@dataclass
class Target:
    key: str
    saved: Any  # TensorStorageMetadata
    dst: Layout  # ranks of the group
    outs: list[torch.Tensor]  # this rank's destination tensors, in dst.boxes_of(rank) order
    chunks: Layout  # the saved chunks, checked (CKPT-1): chunk i on "rank" i
    # a stack's (load_stacks): the tensors it holds, in its dim 0's order
    members: tuple[Target, ...] = ()


@functools.lru_cache(maxsize=1024)
def replicated(shape: tuple[int, ...], world: int) -> Layout:
    """``shape`` held whole by every rank of ``world``: a replicate mesh's layout, so from 64
    ranks it is int64 columns, not W objects (a plain tensor of a state dict on every rank of
    a large job; the layers of a model repeat their shapes, hence the cache)."""
    return mesh_layout(shape, (world,), tuple(range(world)), (None,))


def batches(weights: list[tuple[str, int]], budget: int | None) -> list[list[str]]:
    """The keys, in their order, cut into batches of at most ``budget`` weight (a key heavier
    than the budget alone); one batch when ``budget`` is None."""
    if budget is None:
        return [[k for k, _ in weights]] if weights else []
    out: list[list[str]] = []
    total = 0
    for key, w in weights:
        if not out or total + w > budget:
            out.append([])
            total = 0
        out[-1].append(key)
        total += w
    return out


def _weights(
    targets: list[Target], runs: list[Run], sizes: list[int], world: int
) -> list[tuple[str, int]]:
    """Per exchanged key, the most bytes any one rank holds of it during its exchange: the runs
    it read plus its destination boxes. From the layouts alone, the same on every rank."""
    read: dict[str, list[int]] = {}
    for run in runs:
        read.setdefault(run.key, [0] * world)[run.reader] += run.nbytes
    out: list[tuple[str, int]] = []
    for t in targets:
        item = t.saved.properties.dtype.itemsize
        per = list(read.get(t.key, [0] * world))
        for s in t.dst.shards:
            per[s.rank] += s.box.numel * item
        out.append((t.key, max(per, default=0)))
    return out + [(f"{BYTES_KEY}{i}", 2 * n) for i, n in enumerate(sizes)]


def exchange(
    held: dict[str, list[torch.Tensor]],
    runs: list[Run],
    targets: list[Target],
    values: list[tuple[str, Any]],
    group: dist.ProcessGroup | None,
    comm: torch.device,
    world: int,
    max_buffer_bytes: int | None,
) -> dict[str, bytes]:
    """Deliver the runs to the destinations (a reshard of the state dict, in batches under
    NCCL) and every non-tensor value's bytes to every rank."""
    import torch
    import torch.distributed as dist

    from shardspec.reshard import reshard_state_dict

    dev = _device(targets, comm)
    rank = dist.get_rank(group)
    shards: dict[str, list[Shard]] = {}
    for run in runs:
        shards.setdefault(run.key, []).append(Shard(run.box, run.reader))
    whole = _broadcast_whole(held, runs, targets, group, comm)
    moved = [t for t in targets if t.dst.numel and t.key not in whole]
    sizes = _value_sizes(values, held, group, comm)
    by_key = {t.key: t for t in moved}
    budget = STAGE_BYTES if comm.type == "cuda" else None
    got: dict[str, bytes] = {}
    for keys in batches(_weights(moved, runs, sizes, world), budget):
        state: dict[str, list[torch.Tensor]] = {}
        src: dict[str, Layout] = {}
        dst: dict[str, Layout] = {}
        out: dict[str, list[torch.Tensor]] = {}
        dtypes: dict[str, torch.dtype] = {}
        names: dict[str, str] = {}
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []  # (on dev, the destination)
        stacks: list[tuple[Target, list[torch.Tensor]]] = []  # (a stack, its boxes here)
        for key in keys:
            if key in by_key:
                t = by_key[key]
                src[key] = Layout(t.dst.shape, shards[key])
                dst[key] = t.dst
                if t.members:
                    dtype = t.saved.properties.dtype
                    boxes = [torch.empty(b.sizes, dtype=dtype, device=dev)
                             for b in t.dst.boxes_of(rank)]  # fmt: skip
                    stacks.append((t, boxes))
                    out[key] = boxes
                    names[key] = (
                        f"the {len(t.members)} tensors of one geometry moved as one "
                        f"('{t.members[0].key}' to '{t.members[-1].key}')"
                    )
                else:
                    names[key] = f"tensor '{key}'"
                    out[key] = [_staged(o, dev, staged) for o in t.outs]
                dtypes[key] = t.saved.properties.dtype
            else:  # a value's stored bytes, read by rank i % W
                i = int(key[len(BYTES_KEY) :])
                fqn, n = values[i][0], sizes[i]
                key = BYTES_KEY + fqn
                src[key] = Layout((n,), [Shard(Box((0,), (n,)), i % world)])
                dst[key] = replicated((n,), world)
                out[key] = [torch.empty(n, dtype=torch.uint8, device=dev)]
                dtypes[key] = torch.uint8
                names[key] = f"the stored bytes of value '{fqn}'"
            # popped: a batch's runs leave host memory as it goes
            state[key] = [h.to(dev) for h in held.pop(key, [])]
        result = reshard_state_dict(
            state, src, dst, group, max_buffer_bytes=max_buffer_bytes, dtypes=dtypes, out=out,
            names=names,
        )  # fmt: skip
        for tmp, dest in staged:
            dest.copy_(tmp)
        for t, boxes in stacks:
            _unstack(t, boxes)
        for key in keys:
            if key not in by_key:
                fqn = values[int(key[len(BYTES_KEY) :])][0]
                got[fqn] = result[BYTES_KEY + fqn][0].cpu().numpy().tobytes()
    return got


def _device(targets: list[Target], comm: torch.device) -> torch.device:
    """Where this rank's side of the exchange lives: the GPU of an NCCL group, else the device
    of its first destination (gloo moves CPU and CUDA tensors)."""
    if comm.type != "cpu":
        return comm
    for t in targets:
        for o in t.outs if not t.members else t.members[0].outs:
            return o.device
    return comm


def _staged(
    dest: torch.Tensor, dev: torch.device, staged: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """``dest`` itself where it is on ``dev``, else a new tensor there that receives for it."""
    import torch

    if dest.device == dev:
        return dest
    tmp = torch.empty(dest.shape, dtype=dest.dtype, device=dev)
    staged.append((tmp, dest))
    return tmp


def _unstack(stack: Target, staged: Sequence[torch.Tensor]) -> None:
    """Copy each member's destination boxes out of the stack's (``staged``: this rank's boxes
    of the stack, in its destination's order)."""
    import torch

    with torch.no_grad():
        for bi, box in enumerate(staged):
            parts = box.unbind(0)
            outs = [m.outs[bi] for m in stack.members]
            dev = box.device
            # the fused copy takes plain tensors of the box's device; a conj or neg view, a
            # subclass, another device: one copy_ each, which resolves them
            fused = [
                type(o) is torch.Tensor and o.device == dev and not o.is_conj() and not o.is_neg()
                for o in outs
            ]
            if all(fused):
                torch._foreach_copy_(outs, list(parts))
                continue
            pairs = [(o, p) for o, p, f in zip(outs, parts, fused) if f]
            if pairs:
                torch._foreach_copy_([o for o, _ in pairs], [p for _, p in pairs])
            for o, p, f in zip(outs, parts, fused):
                if not f:
                    o.copy_(p)


# whole_on_every_rank by the layout's identity (the tensors of one geometry share their
# layout object, and a load asks of each tensor several times); an entry holds its layout, so
# no other object takes its id while it lives.
_WHOLE: dict[tuple[int, int], tuple[Layout, bool]] = {}
_WHOLE_MAX = 4096


def whole_on_every_rank(dst: Layout, world: int) -> bool:
    """Whether every rank of the group holds the whole tensor, once (a plain tensor, a
    replicated DTensor)."""
    hit = _WHOLE.get((id(dst), world))
    if hit is not None and hit[0] is dst:
        return hit[1]
    found = _whole_on_every_rank(dst, world)
    if len(_WHOLE) >= _WHOLE_MAX:
        _WHOLE.clear()
    _WHOLE[(id(dst), world)] = (dst, found)
    return found


def _whole_on_every_rank(dst: Layout, world: int) -> bool:
    if len(dst.shards) != world:
        return False
    full = Box((0,) * len(dst.shape), dst.shape)
    return {s.rank for s in dst.shards} == set(range(world)) and all(
        s.box == full for s in dst.shards
    )


def _broadcast_whole(
    held: dict[str, list[torch.Tensor]],
    runs: list[Run],
    targets: list[Target],
    group: dist.ProcessGroup | None,
    comm: torch.device,
) -> set[str]:
    """Deliver the tensors every rank holds whole: each run broadcast by its reader straight
    into every rank's destination (the executor would pack W-1 copies of it into one send
    buffer), through a buffer on the GPU under NCCL where the destination is elsewhere; the
    runs of at most :data:`PACKED_RUN_BYTES` packed per reader into one broadcast of up to
    :data:`PACK_BYTES` (a model's replicated norms and biases are hundreds of tensors of a few
    KiB, and a broadcast costs as much for 1 KiB as for 100 KiB). Which runs are packed, and
    in which order the broadcasts go, follows from the layouts alone: the same on every rank.
    Returns their keys."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(run.key, []).append(run)
    done: set[str] = set()
    # per reader: (its runs' destinations, this rank's read copy or None, bytes so far)
    packs: dict[int, tuple[list[tuple[torch.Tensor, torch.Tensor | None]], list[int]]] = {}
    flights = _Flights(rank, group, comm)
    with torch.no_grad():
        for t in targets:
            if t.dst.numel == 0 or world == 1 or not whole_on_every_rank(t.dst, world):
                continue
            out = t.outs[0]
            wire = comm if comm.type != "cpu" else out.device
            mine = iter(held.pop(t.key, []))  # this rank's runs, in the runs' order
            for run in by_key.get(t.key, []):
                view = out[run.box.slices()]
                got = next(mine) if run.reader == rank else None
                if run.box.numel * out.element_size() <= PACKED_RUN_BYTES:
                    pack, size = packs.setdefault(run.reader, ([], [0]))
                    pack.append((view, got))
                    size[0] += _aligned(run.box.numel * out.element_size())
                    if size[0] >= PACK_BYTES:
                        flights.start(packs.pop(run.reader)[0], run.reader)
                    continue
                done_here = False  # the destination holds the run already (read in place)
                if got is not None:
                    done_here = _same_memory(got, view)
                    buf = got.to(wire)
                    if not buf.is_contiguous():
                        buf = buf.contiguous()
                elif view.is_contiguous() and view.device == wire:
                    buf = view
                else:
                    buf = torch.empty(run.box.sizes, dtype=out.dtype, device=wire)
                # as bytes: gloo broadcasts no int16, bool, uint16... (a contiguous buffer's
                # reshape is a view, so the bytes land in it)
                dist.broadcast(buf.reshape(-1).view(torch.uint8), global_rank(group, run.reader),
                               group=group)  # fmt: skip
                if buf is not view and not done_here:
                    view.copy_(buf)
            done.add(t.key)
        for reader in sorted(packs):
            flights.start(packs[reader][0], reader)
        flights.finish()
    return done


# A run of a tensor every rank holds whole travels packed with others up to this size, in
# packs of up to PACK_BYTES (each a buffer beside the destinations on every rank).
PACKED_RUN_BYTES = 256 << 10
PACK_BYTES = 16 << 20
# Packs in flight at most (each broadcast started as soon as its pack is full; the oldest's
# runs copied out while the next ones travel).
FLIGHT_PACKS = 2
FLIGHT_BYTES = 64 << 20
_ALIGN = 64  # each run's place in a pack: any dtype's view of it is aligned


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def global_rank(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``group``'s rank ``rank`` (collectives name their source by it)."""
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


class _Flights:
    """The packs' broadcasts in flight: each started when its pack is full (the reader's runs
    copied into one buffer), the oldest's runs copied out of it when more than
    :data:`FLIGHT_PACKS` packs or :data:`FLIGHT_BYTES` bytes are in flight, the rest at
    :meth:`finish`: a rank copies one pack's runs out while the next packs travel, where each
    broadcast waited for every rank's copies of the one before."""

    def __init__(self, rank: int, group: dist.ProcessGroup | None, comm: torch.device) -> None:
        self._rank, self._group, self._comm = rank, group, comm
        self._flying: list[tuple[Any, torch.Tensor, list[Any]]] = []
        self._bytes = 0

    def start(self, pack: list[tuple[torch.Tensor, torch.Tensor | None]], reader: int) -> None:
        """One broadcast from ``reader`` of the runs of ``pack`` (each a destination view, and
        on the reader the run it read), each at an aligned place of one byte buffer."""
        import torch
        import torch.distributed as dist

        places, total = [], 0
        for view, _ in pack:
            n = view.numel() * view.element_size()
            places.append((total, n))
            total += _aligned(n)
        buf = torch.empty(total, dtype=torch.uint8, device=self._comm)
        parts = [buf[at : at + n].view(view.dtype).view(view.shape)
                 for (view, _), (at, n) in zip(pack, places)]  # fmt: skip
        if reader == self._rank:
            for (_, got), part in zip(pack, parts):
                assert got is not None
                part.copy_(got)
        work = dist.broadcast(buf, global_rank(self._group, reader), group=self._group,
                              async_op=True)  # fmt: skip
        self._flying.append((work, buf, [(v, g, p) for (v, g), p in zip(pack, parts)]))
        self._bytes += total
        while len(self._flying) > 1 and (
            len(self._flying) > FLIGHT_PACKS or self._bytes > FLIGHT_BYTES
        ):
            self._land()

    def finish(self) -> None:
        while self._flying:
            self._land()

    def _land(self) -> None:
        work, buf, runs = self._flying.pop(0)
        work.wait()
        self._bytes -= buf.numel()
        for view, got, part in runs:
            if got is None or not _same_memory(got, view):
                view.copy_(part)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory."""
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _value_sizes(
    values: list[tuple[str, Any]],
    held: Mapping[str, list[torch.Tensor]],
    group: dist.ProcessGroup | None,
    comm: torch.device,
) -> list[int]:
    """Every value's stored size, known to every rank (only its reader knows it)."""
    import torch
    import torch.distributed as dist

    if not values:
        return []
    sizes = torch.zeros(len(values), dtype=torch.int64)
    for i, (fqn, _) in enumerate(values):
        mine = held.get(BYTES_KEY + fqn)
        if mine:
            sizes[i] = mine[0].numel()
    sizes = sizes.to(comm)
    dist.all_reduce(sizes, group=group)
    return [int(x) for x in sizes.cpu().tolist()]
