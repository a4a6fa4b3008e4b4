"""Rank-side functions for test_dcp_load.py: save a state dict of DTensors, ShardedTensors,
plain tensors and a non-tensor value with DCP, then load it with a given planner into other
layouts, and report every local tensor that differs from the reference slice of the global
tensor (what ``distribute_tensor`` / the shard metadata say the rank holds).

A tensor is described as ``(kind, ...)``: ``("dt", mesh_shape, placements)`` with placements
``("S", dim)`` / ``("R",)`` (``("dt", mesh_shape, placements, d)``: on the sub-mesh of mesh
dim ``d``, one placement, each rank on the mesh of its own coordinate in the other dims),
``("st", layout)`` for a ShardedTensor, ``("plain",)`` for a regular tensor every rank holds
whole."""

from __future__ import annotations

from typing import Any

import torch

from shardspec.reshard.reference import same_bits
from shardspec.testing.tensors import make_sharded_tensor, random_tensor

Entry = tuple[str, tuple[int, ...], str]  # name, shape, dtype name


def full_tensor(name: str, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(name))
    return random_tensor(shape, getattr(torch, dtype), seed)


def _build(full: torch.Tensor, how: tuple[Any, ...], zero: bool) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    src = torch.zeros_like(full) if zero else full
    if how[0] == "plain":
        return src.clone()
    if how[0] == "st":
        return make_sharded_tensor(src, how[1])
    if len(how) > 3:  # on the sub-mesh of mesh dim how[3]: a mesh of part of the world
        names = tuple(f"d{i}" for i in range(len(how[1])))
        mesh = init_device_mesh("cpu", how[1], mesh_dim_names=names)[names[how[3]]]
    else:
        mesh = init_device_mesh("cpu", how[1])
    if any(p[0] == "SS" for p in how[2]):
        # torch's distribute_tensor asserts on a leading _StridedShard; ours places it
        # (DTENSOR-7), and the "default" load (dcp.load) checks it independently
        from shardspec.reshard.dtensor_io import distribute_dtensor

        return distribute_dtensor(src, mesh, _placements(how[2]), src_rank=None)
    return distribute_tensor(src, mesh, _placements(how[2]))


def _placements(spec: list[Any]) -> list[Any]:
    """("S", dim), ("R",), or ("SS", dim, split_factor): a _StridedShard (FSDP2 + TP)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out: list[Any] = []
    for p in spec:
        if p[0] == "SS":
            out.append(_StridedShard(p[1], split_factor=p[2]))
        else:
            out.append(Shard(p[1]) if p[0] == "S" else Replicate())
    return out


def _expected_locals(full: torch.Tensor, how: tuple[Any, ...]) -> list[torch.Tensor]:
    """The reference: what the rank holds of ``full`` in layout ``how``, built by torch's own
    scatter (DTensor) or by slicing at the shard metadata (ShardedTensor)."""
    obj = _build(full, how, zero=False)
    return _locals(obj)


def _locals(obj: Any) -> list[torch.Tensor]:
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return [obj.to_local()]
    if isinstance(obj, ShardedTensor):
        return [s.tensor for s in obj.local_shards()]
    return [obj]


def save(
    rank: int,
    world: int,
    path: str,
    entries: list[tuple[Entry, tuple[Any, ...]]],
    ours: bool,
) -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import SavePlanner

    sd: dict[str, Any] = {
        name: _build(full_tensor(name, shape, dt), how, zero=False)
        for (name, shape, dt), how in entries
    }
    sd["step"] = {"epoch": 3, "note": "not a tensor"}
    dcp.save(sd, checkpoint_id=path, planner=SavePlanner() if ours else None)


def load(
    rank: int,
    world: int,
    path: str,
    entries: list[tuple[Entry, tuple[Any, ...]]],
    planner: str,
) -> dict[str, Any]:
    """Load with ``planner``: "ours" or "default" (``dcp.load`` with our planner or DCP's), or
    "load-own", "load-once", "load-auto" (``shardspec.checkpoint.load`` with that ``reads``;
    "load-auto-shared", "load-auto-local": told the storage); return the failures and what
    was read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from shardspec.checkpoint.collective_load import load as collective_load
    from shardspec.checkpoint.dcp import LoadPlanner

    sd: dict[str, Any] = {}
    fulls: dict[str, torch.Tensor] = {}
    for (name, shape, dt), how in entries:
        fulls[name] = full_tensor(name, shape, dt)
        sd[name] = _build(fulls[name], how, zero=True)
    sd["step"] = {"epoch": 0, "note": ""}
    stats = None
    if planner.startswith("load-"):
        reads, _, storage = planner[len("load-") :].partition("-")
        stats = collective_load(sd, path, reads=reads, storage=storage or None)
    else:
        dcp.load(
            sd,
            checkpoint_id=path,
            planner=LoadPlanner() if planner == "ours" else DefaultLoadPlanner(),
        )
    failures: list[str] = []
    for (name, _, _), how in entries:
        got = _locals(sd[name])
        want = _expected_locals(fulls[name], how)
        if len(got) != len(want):
            failures.append(f"rank {rank} {name}: {len(got)} local tensors, want {len(want)}")
            continue
        for i, (g, w) in enumerate(zip(got, want)):
            if not same_bits(g, w):
                failures.append(f"rank {rank} {name}[{i}] ({planner}): loaded bytes differ")
    if sd["step"] != {"epoch": 3, "note": "not a tensor"}:
        failures.append(f"rank {rank}: the non-tensor value loaded as {sd['step']!r}")
    return {
        "failures": failures,
        "bytes": {n: [t.numel() for t in _locals(sd[n])] for n in fulls},
        "stats": None if stats is None else vars(stats),
    }


def load_expecting_error(rank: int, world: int, path: str, entries: list[Any]) -> str:
    """Load with our planner from a damaged checkpoint; return the error every rank sees."""
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import LoadPlanner, chunk_error

    sd: dict[str, Any] = {}
    for (name, shape, dt), how in entries:
        sd[name] = _build(full_tensor(name, shape, dt), how, zero=True)
    before = {n: [t.clone() for t in _locals(v)] for n, v in sd.items()}
    try:
        dcp.load(sd, checkpoint_id=path, planner=LoadPlanner())
    except BaseException as e:  # DCP wraps rank errors in CheckpointException (BaseException)
        untouched = all(
            all(same_bits(a, b) for a, b in zip(before[n], _locals(v))) for n, v in sd.items()
        )
        found = chunk_error(e)
        ours = f"{found.kind} {found.fqn!r}" if found is not None else None
        return f"{type(e).__name__}: {e} | untouched={untouched} | chunk_error={ours}"
    return "no error"


def load_failing(
    rank: int,
    world: int,
    path: str,
    entries: list[tuple[Entry, tuple[Any, ...]]],
    reads: str,
    tweak: str = "",
) -> str:
    """``shardspec.checkpoint.load`` expected to fail; ``tweak`` spoils rank 1's state dict
    ("shape", "dtype", "key", "kind", "plain"), rank 3's (``submesh``: its first entry, a
    DTensor on a sub-mesh, replicated) or every rank's ("missing"). Returns what this rank
    raised (type and message) or "no error"."""
    from shardspec.checkpoint.collective_load import load as collective_load

    sd: dict[str, Any] = {}
    for (name, shape, dt), how in entries:
        sd[name] = _build(full_tensor(name, shape, dt), how, zero=True)
    first = entries[0][0][0]
    if tweak == "missing":
        sd["not.saved"] = torch.zeros(2)
    elif rank == 1 and tweak == "shape":
        sd[first] = torch.zeros(1, 1)
    elif rank == 1 and tweak == "dtype":
        sd[first] = sd[first].to(torch.complex128)
    elif rank == 1 and tweak == "key":
        sd["not.saved"] = torch.zeros(2)
    elif rank == 1 and tweak == "kind":
        sd[first] = 7
    elif rank == 1 and tweak == "plain":  # fine on its own, but not what the others hold
        sd[first] = torch.zeros(entries[0][0][1], dtype=getattr(torch, entries[0][0][2]))
    elif rank == 3 and tweak == "submesh":  # its mesh's other rank shards it; it replicates
        from torch.distributed.tensor import DTensor, Replicate

        held = sd[first]  # made without a collective, which rank 1 would not join
        sd[first] = DTensor.from_local(
            torch.zeros(held.shape, dtype=held.dtype), held.device_mesh, [Replicate()],
            run_check=False,
        )  # fmt: skip
    try:
        collective_load(sd, path, reads=reads)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def load_safetensors(
    rank: int,
    world: int,
    path: str,
    entries: list[tuple[Entry, tuple[Any, ...]]],
    reads: str,
) -> dict[str, Any]:
    """``shardspec.checkpoint.load`` of a safetensors checkpoint (written with
    ``safetensors.torch.save_file`` of :func:`full_tensor` values) into ``entries``' layouts;
    the failures against the reference slices of ``load_file``'s tensors, and, for the
    tensors every rank holds whole, the same load through ``dcp.load`` with torch's
    ``HuggingFaceStorageReader`` (its baseline) compared bit for bit."""
    import glob
    import os

    from safetensors.torch import load_file

    from shardspec.checkpoint.collective_load import load as collective_load

    files = (
        [path] if path.endswith(".safetensors") else glob.glob(os.path.join(path, "*.safetensors"))
    )
    saved: dict[str, torch.Tensor] = {}
    for f in files:
        saved.update(load_file(f))
    sd = {name: _build(saved[name], how, zero=True) for (name, _, _), how in entries}
    stats = collective_load(sd, path, reads=reads)
    failures = []
    for (name, _, _), how in entries:
        got, want = _locals(sd[name]), _expected_locals(saved[name], how)
        for i, (g, w) in enumerate(zip(got, want)):
            if not same_bits(g, w):
                failures.append(f"rank {rank} {name}[{i}]: loaded bytes differ")
    if os.path.isdir(path):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        plain = {n: torch.zeros_like(saved[n]) for (n, _, _), how in entries if how[0] == "plain"}
        if plain:
            dcp.load(plain, storage_reader=HuggingFaceStorageReader(path))
            for n, t in plain.items():
                if not same_bits(t, sd[n]):
                    failures.append(f"rank {rank} {n}: HuggingFaceStorageReader loaded other bytes")
    return {"failures": failures, "stats": vars(stats)}


def load_on_subgroups(
    rank: int, world: int, path: str, entries: list[tuple[Entry, tuple[Any, ...]]], reads: str
) -> dict[str, Any]:
    """Ranks {0, 2} and {1, 3} each load the checkpoint on their own group, into plain tensors
    and a DTensor on the group's own 1-D mesh; the failures against the saved values."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from shardspec.checkpoint.collective_load import load as collective_load

    # mesh dim "s" holds ranks (0, 2) and (1, 3): its groups are the two subgroups
    grid = DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("g", "s"))
    mesh = grid["s"]
    mine = grid.get_group("s")
    assert sorted(dist.get_process_group_ranks(mine)) == [rank % 2, rank % 2 + 2]
    sd: dict[str, Any] = {}
    fulls = {}
    for (name, shape, dt), _ in entries:
        fulls[name] = full_tensor(name, shape, dt)
        if len(shape) and name.startswith("dt"):
            sd[name] = distribute_tensor(torch.zeros_like(fulls[name]), mesh, [Shard(0)])
        else:
            sd[name] = torch.zeros_like(fulls[name])
    sd["step"] = {"epoch": 0, "note": ""}
    stats = collective_load(sd, path, group=mine, reads=reads)
    failures = []
    for name, full in fulls.items():
        obj = sd[name]
        got = obj.full_tensor() if hasattr(obj, "full_tensor") else obj
        if not same_bits(got, full):
            failures.append(f"rank {rank} {name}: loaded bytes differ")
    if sd["step"] != {"epoch": 3, "note": "not a tensor"}:
        failures.append(f"rank {rank}: the value loaded as {sd['step']!r}")
    return {"failures": failures, "stats": vars(stats)}


def load_peer(
    rank: int,
    world: int,
    path: str,
    tensors: dict[str, tuple[tuple[int, ...], str]],
    values: list[str],
    reads: str,
) -> dict[str, Any]:
    """``shardspec.checkpoint.load`` of a checkpoint another library wrote: each tensor as a
    DTensor sharded by rows over the world (whole when 0-d), each named value as a plain
    value; returns the full tensors (gathered by the test's own all-gather) and the values."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from shardspec.checkpoint.collective_load import load as collective_load

    mesh = init_device_mesh("cpu", (world,))
    sd: dict[str, Any] = {}
    for name, (shape, dt) in tensors.items():
        zeros = torch.full(shape, -1, dtype=getattr(torch, dt))
        sd[name] = distribute_tensor(zeros, mesh, [Shard(0) if shape else Replicate()])
    for name in values:
        sd[name] = None
    stats = collective_load(sd, path, reads=reads)
    out = {}
    for name in tensors:
        local = sd[name].to_local().contiguous()
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local)
        out[name] = torch.cat(gathered) if local.dim() else gathered[0]
    return {"tensors": out, "values": {n: sd[n] for n in values}, "stats": vars(stats)}


class _Unreportable:
    """A layout whose report cannot be built (its ranks raise)."""

    @property
    def ranks(self) -> tuple[int, ...]:
        raise RuntimeError("no ranks here")


def whole_layouts_of(rank: int, world: int, case: str) -> str:
    """:func:`shardspec.checkpoint.load_submeshes.whole_layouts` on 2 ranks, each reporting
    tensor "x" of 4 elements: ``ok`` (each rank its own mesh, holding all of it), ``shared``
    (rank 0's mesh holds ranks 0 and 1, rank 1's only itself), ``unreportable`` (rank 1's
    report cannot be built). Returns the whole layout's shards, or the error raised."""
    from shardspec.checkpoint.load_submeshes import whole_layouts
    from shardspec.metadata import Box, Layout, Shard

    mine: Any = Layout((4,), [Shard(Box((0,), (4,)), rank)])
    if case == "shared" and rank == 0:
        mine = Layout((4,), [Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)])
    if case == "unreportable" and rank == 1:
        mine = _Unreportable()
    try:
        (whole,) = whole_layouts([("x", mine)], rank, None, torch.device("cpu"))
    except ValueError as e:
        return f"ValueError: {e}"
    return repr([(s.box.offsets, s.box.sizes, s.rank) for s in whole.shards])
