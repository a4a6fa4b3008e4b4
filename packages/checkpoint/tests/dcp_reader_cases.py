"""Rank-side functions for test_dcp_reader.py: save one tensor as a ShardedTensor with DCP,
then load it into a ShardedTensor or a DTensor twice, with shardspec's ``FileSystemReader``
and ``LoadPlanner`` and with DCP's default reader and planner, and return what each loaded
plus what our reader read.

A destination is ``("st", layout)`` or ``("dt", mesh_shape, placements)`` with placements
``("S", dim)`` / ``("R",)``."""

from __future__ import annotations

import gzip
import os
from typing import IO, Any

import torch
from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension

from shardspec.metadata import Layout
from shardspec.testing.tensors import make_sharded_tensor


def save_sharded(
    rank: int, world: int, path: str, full: torch.Tensor, layout: Layout, gz: bool = False
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from shardspec.checkpoint.dcp import SavePlanner

    sd: dict[str, Any] = {"t": make_sharded_tensor(full, layout), "extra": {"step": 7}}
    writer = FileSystemWriter(path, _extensions=[Gzip()] if gz else None)
    dcp.save(sd, storage_writer=writer, planner=SavePlanner())


def _destination(full: torch.Tensor, how: tuple[Any, ...], fill: torch.Tensor) -> Any:
    src = fill.expand(full.shape).clone()
    if how[0] == "st":
        return make_sharded_tensor(src, how[1])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", how[1])
    placements = [Shard(p[1]) if p[0] == "S" else Replicate() for p in how[2]]
    return distribute_tensor(src, mesh, placements, src_data_rank=None)


def _locals(obj: Any) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return [obj.to_local()]
    return [s.tensor for s in obj.local_shards()]


def _expected(full: torch.Tensor, how: tuple[Any, ...]) -> list[torch.Tensor]:
    """The reference: slices of ``full`` at the shard metadata (ShardedTensor), or torch's own
    scatter of ``full`` (DTensor)."""
    if how[0] == "st":
        me = torch.distributed.get_rank()
        return [full[s.box.slices()] for s in how[1].shards if s.rank == me]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", how[1])
    placements = [Shard(p[1]) if p[0] == "S" else Replicate() for p in how[2]]
    return [distribute_tensor(full, mesh, placements).to_local()]


def load_both(
    rank: int,
    world: int,
    path: str,
    full: torch.Tensor,
    how: tuple[Any, ...],
    reader_options: dict[str, Any],
) -> dict[str, Any]:
    """Load ``path`` into ``how`` with our reader + planner and with DCP's defaults (each
    into a destination filled with a value no saved element needs to hold); return both
    results, the reference and our reader's stats."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader as DcpReader

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    fill = torch.ones((), dtype=full.dtype)
    ours = _destination(full, how, fill)
    reader = FileSystemReader(path, trace_reads=True, **reader_options)
    sent: list[int] = []  # read items in the plan this rank gives DCP's plan exchange
    prepare = reader.prepare_local_plan

    def spy(plan: Any) -> Any:
        out = prepare(plan)
        sent.append(len(out.items))
        return out

    reader.prepare_local_plan = spy
    dcp.load({"t": ours}, storage_reader=reader, planner=LoadPlanner())
    stats = reader.stats
    # The object apart: DCP's flattening drops a ShardedTensor with no local shards, and
    # its fallback to pre-2.4 keys would then keep "extra" unflattened (a planner matter).
    extra: dict[str, Any] = {"step": 0}
    dcp.load({"extra": extra}, storage_reader=reader, planner=LoadPlanner())
    theirs = _destination(full, how, fill)
    dcp.load({"t": theirs}, storage_reader=DcpReader(path), planner=DefaultLoadPlanner())
    s = stats
    return {
        "ours": [t.clone() for t in _locals(ours)],
        "dcp": [t.clone() for t in _locals(theirs)],
        "want": [t.clone() for t in _expected(full, how)],
        "extra": extra,
        "ranges": s.ranges,
        "buffer_peak": s.buffer_peak,
        "threads": s.threads,
        "items": s.items,
        "sent_items": sent,
        "extra_fallback_items": reader.stats.fallback_items,
    }


def load_expecting_error(
    rank: int, world: int, path: str, full: torch.Tensor, how: tuple[Any, ...]
) -> str:
    """Load with our reader from a damaged checkpoint; return the error this rank sees."""
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner, read_error

    dest = _destination(full, how, torch.zeros((), dtype=full.dtype))
    try:
        dcp.load({"t": dest}, storage_reader=FileSystemReader(path), planner=LoadPlanner())
    except BaseException as e:  # DCP wraps rank errors in CheckpointException (BaseException)
        ours = read_error(e)
        return f"{type(e).__name__}: {e}\nread_error: {ours}"
    return "no error"


def load_gzip(
    rank: int, world: int, path: str, full: torch.Tensor, how: tuple[Any, ...]
) -> dict[str, Any]:
    """Load a checkpoint whose items went through the ``Gzip`` transform with our reader."""
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    registry = ExtensionRegistry()
    registry.register(Gzip)
    dest = _destination(full, how, torch.ones((), dtype=full.dtype))
    reader = FileSystemReader(path, registry)
    dcp.load({"t": dest}, storage_reader=reader, planner=LoadPlanner())
    return {
        "got": [t.clone() for t in _locals(dest)],
        "want": [t.clone() for t in _expected(full, how)],
        "fallback_items": reader.stats.fallback_items,
        "items": reader.stats.items,
    }


class Gzip(StreamTransformExtension):  # type: ignore[misc]
    """A storage transform for the tests: gzip each item (DCP's own ZStandard needs a
    package this environment lacks)."""

    @staticmethod
    def registry_name() -> str:
        return "shardspec-test-gzip"

    @staticmethod
    def from_descriptor(version: str) -> Gzip:
        return Gzip()

    def get_descriptor(self) -> str:
        return f"{self.registry_name()}/1"

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        return gzip.GzipFile(fileobj=output, mode="wb")  # closing it leaves ``output`` open

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:
        return gzip.GzipFile(fileobj=input, mode="rb")


def file_sizes(rank: int, world: int, path: str) -> dict[str, int]:
    return {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)}


def target_layouts(rank: int, world: int, entries: list[Any]) -> str:
    """``layouts_of`` of the state dict ``dcp_load_cases`` builds for ``entries`` on this
    world (what a user runs on the target job to get the ``--layouts`` file)."""
    from dcp_load_cases import _build, full_tensor

    from shardspec.checkpoint.offline import layouts_of

    sd = {name: _build(full_tensor(name, shape, dt), how, zero=True)
          for (name, shape, dt), how in entries}  # fmt: skip
    return layouts_of(sd)


def load_traced(rank: int, world: int, path: str, entries: list[Any]) -> list[str]:
    """Load with our reader; the files this rank read bytes from."""
    import torch.distributed.checkpoint as dcp
    from dcp_load_cases import _build, full_tensor

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    sd = {name: _build(full_tensor(name, shape, dt), how, zero=True)
          for (name, shape, dt), how in entries}  # fmt: skip
    reader = FileSystemReader(path, trace_reads=True)
    dcp.load(sd, storage_reader=reader, planner=LoadPlanner())
    return sorted({os.path.basename(f) for f, _, _ in reader.stats.ranges})
