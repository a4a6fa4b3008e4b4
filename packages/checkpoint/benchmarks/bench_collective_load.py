"""``shardspec.checkpoint.load`` (reads="own" and reads="once") against ``dcp.load`` with our
planner + reader ("ours"), DCP's default, the read floor and the all-to-all floor, measured in
the same run (spec/09-checkpoint.md, CKPT-23 to CKPT-27); and the load's protocol against the
world size on simulated worlds.

Cases, on local gloo ranks (a ``RankPool`` per world size, started once), built by
``bench_dcp_load`` (``many``, ``cols``, ``grid``, ``big``, ``pre``) and here (``rep``,
``reps``):

* ``many``  2,000 float32 tensors of 48 x 40 saved on 4 ranks as ``Shard(0)``, loaded as
  ``Shard(1)`` on 2 and on 4.
* ``cols`` / ``grid``  the 10,000-chunk grid, loaded as the grid shifted in dim 2 / in both.
* ``big``  1 GiB on 4 row chunks, loaded as columns on 2 and as rows on 8.
* ``rep``  a 1 GiB model (8 float32 tensors of 128 MiB), DTensor ``Replicate`` on a 4-mesh:
  saved from 4 ranks (DCP saves each replicated tensor once) and loaded ``Replicate`` on 4.
  ``reads="own"`` and ``dcp.load`` read it once per rank (4 GiB per job); ``reads="once"``
  reads it once per job.
* ``reps``  300 float32 tensors of 16 KiB (a model's norms and biases), DTensor ``Replicate``
  on a 4-mesh, saved and loaded as ``rep``: ``reads="once"`` broadcasts them in packs
  (CKPT-24), its exchange floor the same broadcasts of raw buffers.
* ``shared``  the ``rep`` checkpoint on simulated shared storage: every byte a rank's load
  reads from a data file (``os.pread``/``os.preadv``, and each private mapping of a file by
  its length when it is made) first reserves ``n / B`` seconds of one pipe that every rank of
  the job shares, ``B`` = ``SHARED_BANDWIDTH`` bytes a second in all: the next free time sits
  in a file, taken under an ``fcntl`` lock; a read waits until its slot ends, then reads from
  the page cache. ``.metadata`` reads are not charged (below 1 MiB). Timed: ``load-own``,
  ``load-once`` and the floor (every file read once, through the pipe); untimed,
  ``reads="auto"`` told ``storage="shared"`` and told ``"local"``, whose choices are printed
  against the faster mode. ``own`` reads the model once a rank (4 GiB), ``once`` once a job.
* ``pre``  checkpoints rewritten offline (``shardspec reshard``) into the target layout,
  loaded on their own world: ``big`` on 8 (rows) and on 2 (columns), ``many`` on 2.

Variants: ``load-own`` / ``load-once`` (:func:`shardspec.checkpoint.load`), ``ours``
(``dcp.load``, our ``LoadPlanner`` + ``FileSystemReader``), ``default`` (DCP's planner and
reader), ``floor`` (no load: every ``.distcp`` file read once between the ranks, whole files,
into buffers allocated and touched before the clock; the verdicts' floor), ``floor-W`` (the
same bytes cut in W even ranges, one a rank: with more ranks than files every rank reads, as
in a load; shown beside, never used for a verdict) and ``a2a`` (no load: the exchange floor,
one ``all_to_all_single`` with, for every pair of ranks, the bytes ``load-once``'s exchange sent
between them, then the same broadcasts (sizes, roots) it made of the tensors every rank holds
whole, recorded in an untimed ``load-once`` on the same rank; buffers allocated and touched
before the clock). Per variant: the slowest rank's wall time from a barrier to a
barrier (median of ``--repeat`` runs, 3 by default and 9 for the 1 GiB and 10,000-chunk
cases, after one
untimed run, except DCP's default: a minute per load on the grid, timed once there and never
run untimed, its imports are ours' and the others' untimed runs cached the files; the order
rotates), the bytes read from
storage (per rank: the most any rank read; per job: the sum; ``LoadStats.bytes_read`` for
``load``; for ``ours`` our reader's count plus the ``.metadata`` file every rank reads; DCP's
default reader counts nothing: n/a), and the peak RSS above the RSS before the load
(destinations allocated before; pages of files our reader maps count as RSS; the kernel's
high-water mark where it can be reset, so no sampling thread runs beside the load).
Before anything is reported, every rank checks that every loader (and ``reads="auto"``, run
once untimed to learn which mode it picks) loaded the same bytes. "needed" is counted apart
from ``load``: the saved bytes some destination box of the job covers.

``scale``: the protocol against W on simulated worlds (W threads of one process on torch's
threaded process group, :mod:`shardspec.testing.simulated`) with a fixed share per rank: 4
float32 tensors of (2W, 40), saved in W row chunks (one process, then ``shardspec reshard``)
and loaded as the same rows (``Shard(0)`` on a W-mesh): each rank loads 4 chunks of 2 x 40.
The threads share one interpreter lock, so a simulated world runs its ranks one after
another: a rank's wall time there is W ranks' work. What is reported per rank is CPU time:
``load``'s phase clock is pointed at the thread's CPU clock for this case, and ``dcp.load``
(ours, which reads 1.3 KiB per rank here) is timed with it around the call. The threaded
group does a collective's copies on one thread: the mean over ranks charges each rank its
share, as a real all-gather would. The process caches whose entries grow with W (destination
layouts, saved-chunk checks, chunk indexes) are kept per thread for this case, so each
simulated rank builds its own, as a real rank does on its first load. Besides the mean, the
99th percentile and the most of the ranks other than rank 0 are shown; the verdict takes the
percentile, since the most of W - 1 noisy samples grows with W at any fixed spread. The load
runs with ``reads="own"`` and again with ``reads="auto"`` (the default, which must decide the
mode from every destination and saved chunk: "own" here), whose mean is shown too.

Other jobs may share the machine: run under the timing lock, and read the ratios::

    flock /tmp/shardspec-timing.lock python packages/checkpoint/benchmarks/bench_collective_load.py
    python packages/checkpoint/benchmarks/bench_collective_load.py --quick   # smoke run
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_dcp_load import (
    BIG_SHAPE,
    GRID_CELLS,
    N_TENSORS,
    QUICK,
    _digest,
    _floor_buffers,
    _read_floor,
    _RssPeak,
    _state as _dcp_state,
    reshard_offline,
    save as _dcp_save,
)

from shardspec.metadata import Box, chunk_layout
from shardspec.testing import RankPool

REP_TENSORS, REP_SHAPE = 8, (512 if QUICK else 32_768, 1024)  # float32: 2 MiB quick, 128 MiB
REPS_TENSORS, REPS_SHAPE = (30 if QUICK else 300), (64, 64)  # float32: 16 KiB
# A simulated world runs its ranks' work one after another: W = 1024 took 9-15 s here once
# rank 0 sent the metadata as columns (it did not finish in 25 minutes before, 2026-11-28).
SIM_WORLDS = (8, 64) if QUICK else (8, 64, 256, 1024)
SIM_TENSORS, SIM_ROWS, SIM_COLS = 4, 2, 40  # per rank: one (2, 40) chunk of each of 4 tensors

# the loaders: their digests must agree; "load-auto" runs once, untimed
LOADERS = ("load-own", "load-once", "ours", "default")
VARIANTS = (*LOADERS, "floor", "floor-W", "a2a")


# ---------------------------------------------------------------- rank side


def _rep(world: int, zero: bool, n: int, shape: tuple[int, ...]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for i in range(n):
        if zero:
            full = torch.zeros(shape)
        else:  # cheap to make, distinct per tensor
            full = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
            full.add_(i * 0.25)
        out[f"rep{i}.w"] = DTensor.from_local(full, mesh, [Replicate()], run_check=False)
    return out


def _state(case: str, world: int, zero: bool) -> dict[str, Any]:
    if case == "rep":
        return _rep(world, zero, REP_TENSORS, REP_SHAPE)
    if case == "reps":
        return _rep(world, zero, REPS_TENSORS, REPS_SHAPE)
    return _dcp_state(case, world, zero)


def save(rank: int, world: int, path: str, case: str) -> None:
    if case not in ("rep", "reps"):
        _dcp_save(rank, world, path, case)
        return
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import SavePlanner

    dcp.save(_state(case, world, zero=False), checkpoint_id=path, planner=SavePlanner())


# (path, case) -> (bytes sent to each rank, bytes received from each, the broadcasts: (bytes,
# global root) in order) by load-once's exchange
_SPLITS: dict[tuple[str, str], tuple[list[int], list[int], list[tuple[int, int]]]] = {}


def _record_splits(
    path: str, case: str, world: int
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Run ``load(reads="once")`` (untimed) with its exchange watched: the bytes its
    ``all_to_all_single`` calls (or messages) sent to and received from each rank, summed, and every
    broadcast it made (a tensor every rank holds whole travels so, CKPT-24)."""
    import torch.distributed as dist

    import shardspec.checkpoint.collective_load as load_module

    sends, recvs = [0] * world, [0] * world
    casts: list[tuple[int, int]] = []
    real, real_bcast, real_exchange = dist.all_to_all_single, dist.broadcast, load_module.exchange
    watching = [False]

    def spy(
        output: Any,
        input: Any,
        output_split_sizes: Any = None,
        input_split_sizes: Any = None,
        **kw: Any,
    ) -> Any:
        for acc, t, sizes in (
            (sends, input, input_split_sizes),
            (recvs, output, output_split_sizes),
        ):
            split = list(sizes) if sizes else [t.numel() // world] * world
            for r, n in enumerate(split):
                acc[r] += int(n) * t.element_size()
        return real(output, input, output_split_sizes, input_split_sizes, **kw)

    real_batch = dist.batch_isend_irecv

    def batch(ops: Any) -> Any:
        # on gloo the exchange's rounds are messages (shardspec.reshard.executor): the same
        # per-pair bytes, one operation each
        for p2p in ops:
            acc = sends if p2p.op is dist.isend else recvs
            acc[p2p.group_peer] += p2p.tensor.numel() * p2p.tensor.element_size()
        return real_batch(ops)

    def bcast(tensor: Any, src: Any = None, *a: Any, **kw: Any) -> Any:
        if watching[0]:  # the exchange's, not the metadata's or an agreement's
            casts.append((tensor.numel() * tensor.element_size(), int(src)))
        return real_bcast(tensor, src, *a, **kw)

    def exchange(*a: Any, **kw: Any) -> Any:
        watching[0] = True
        try:
            return real_exchange(*a, **kw)
        finally:
            watching[0] = False

    dist.all_to_all_single, dist.broadcast = spy, bcast  # type: ignore[assignment]
    dist.batch_isend_irecv = batch  # type: ignore[assignment]
    load_module.exchange = exchange  # type: ignore[assignment]
    try:
        load_module.load(_state(case, world, zero=True), path, reads="once")
    finally:
        dist.all_to_all_single, dist.broadcast = real, real_bcast
        dist.batch_isend_irecv = real_batch
        load_module.exchange = real_exchange  # type: ignore[assignment]
    return sends, recvs, casts


def _a2a_buffers(path: str, case: str, rank: int, world: int) -> tuple[Any, ...]:
    key = (path, case)
    if key not in _SPLITS:
        _SPLITS[key] = _record_splits(path, case, world)
    sends, recvs, casts = _SPLITS[key]
    send = torch.empty(sum(sends), dtype=torch.uint8).fill_(1)
    recv = torch.empty(sum(recvs), dtype=torch.uint8).fill_(1)
    moved = sum(n for r, n in enumerate(sends) if r != rank)
    moved += sum(n for n, root in casts if root == rank) * (world - 1)
    bufs = [(torch.empty(n, dtype=torch.uint8).fill_(1), root) for n, root in casts]
    return send, recv, sends, recvs, moved, bufs


# Simulated shared storage: one pipe of this many bytes a second for the whole job
# (--shared-mib; rank processes read it from the environment). At 1 GiB/s, 2026-11-29 with
# another engineer's tests beside it, once's broadcasts (3.6 s for 1 GiB on 4 gloo ranks)
# cost more than own's 3 GiB of extra reads: once wins below about 3 GiB / its exchange.
SHARED_BANDWIDTH = int(os.environ.get("SHARDSPEC_BENCH_SHARED_MIB", 64 if QUICK else 1024)) << 20


class _Pipe:
    """Every rank's reads share ``bandwidth``: a read of n bytes takes the pipe's next free
    slot of n / bandwidth seconds (the slot's end kept in ``path``, under an ``fcntl`` lock,
    so the ranks' processes share it) and sleeps until that slot ends."""

    def __init__(self, path: str, bandwidth: int) -> None:
        self.path, self.bandwidth = path, bandwidth
        self.pread, self.preadv, self.mmap = os.pread, os.preadv, __import__("mmap").mmap

    def take(self, n: int) -> None:
        import fcntl
        import struct

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = self.pread(fd, 8, 0)
            now = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
            start = max(now, struct.unpack("d", raw)[0] if len(raw) == 8 else 0.0)
            end = start + n / self.bandwidth
            os.pwrite(fd, struct.pack("d", end), 0)
        finally:
            os.close(fd)  # releases the lock
        time.sleep(max(0.0, end - now))

    def __enter__(self) -> _Pipe:
        import mmap

        pipe = self

        def pread(fd: int, n: int, offset: int) -> bytes:
            pipe.take(n)
            return pipe.pread(fd, n, offset)

        def preadv(fd: int, buffers: Any, offset: int, *a: Any) -> int:
            pipe.take(sum(memoryview(b).nbytes for b in buffers))
            return pipe.preadv(fd, buffers, offset, *a)

        def mapped(fileno: int, length: int, *a: Any, **kw: Any) -> Any:
            if fileno != -1:  # a file's bytes, every one read when the load touches it
                pipe.take(length)
            return pipe.mmap(fileno, length, *a, **kw)

        os.pread, os.preadv, mmap.mmap = pread, preadv, mapped  # type: ignore[assignment,misc]
        return self

    def __exit__(self, *exc: Any) -> None:
        import mmap

        os.pread, os.preadv, mmap.mmap = self.pread, self.preadv, self.mmap  # type: ignore[misc]


def shared_load(
    rank: int, world: int, path: str, pipe: str, variant: str, storage: str | None
) -> dict[str, Any]:
    """:func:`load` of the ``rep`` checkpoint with every data read through the shared pipe."""
    with _Pipe(pipe, SHARED_BANDWIDTH):
        return load(rank, world, path, "rep", variant, storage)


def load(
    rank: int, world: int, path: str, case: str, variant: str, storage: str | None = None
) -> dict[str, Any]:
    """One load (or floor) of ``variant`` on this rank: seconds (barrier to barrier), peak RSS
    above the start, digest of the loaded local bytes, storage bytes read (-1: not counted),
    data bytes read, the load's phases and read mode, bytes sent to other ranks (a2a)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader as DcpReader

    from shardspec.checkpoint.collective_load import LoadStats, load as collective_load
    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    sd = _state(case, world, zero=True) if variant in (*LOADERS, "load-auto") else {}
    buffers = (
        _floor_buffers(path, rank, world, spread=variant == "floor-W")
        if variant.startswith("floor")
        else []
    )
    a2a = _a2a_buffers(path, case, rank, world) if variant == "a2a" else None
    meta = os.path.getsize(os.path.join(path, ".metadata"))
    out: dict[str, Any] = {"bytes": -1, "data": -1, "phases": {}, "reads": "", "moved": 0}
    out["storage"] = ""
    reader = FileSystemReader(path) if variant == "ours" else None
    stats: LoadStats | None = None
    dist.barrier()
    with _RssPeak() as rss:
        t0 = time.perf_counter()
        if variant.startswith("load-"):
            stats = collective_load(sd, path, reads=variant[len("load-") :], storage=storage)
        elif reader is not None:
            dcp.load(sd, storage_reader=reader, planner=LoadPlanner())
        elif variant == "default":
            dcp.load(sd, storage_reader=DcpReader(path), planner=DefaultLoadPlanner())
        elif variant.startswith("floor"):
            _read_floor(buffers)
        else:
            assert a2a is not None
            send, recv, sends, recvs, out["moved"], casts = a2a
            if sum(sends) or sum(recvs):
                dist.all_to_all_single(
                    recv, send, output_split_sizes=recvs, input_split_sizes=sends
                )
            for buf, root in casts:
                dist.broadcast(buf, root)
        dist.barrier()
        out["seconds"] = time.perf_counter() - t0
        # Untimed: a rank that left the barrier first would otherwise start hashing its tensors
        # and take the cores from the ranks still leaving it, whose clocks are still running.
        dist.barrier()
    out["rss"] = rss.above
    if stats is not None:
        out.update(bytes=stats.bytes_read, data=stats.data_bytes, phases=stats.seconds)
        out["reads"] = stats.reads
        out["storage"] = stats.storage
    elif reader is not None:
        out.update(bytes=reader.stats.bytes_read + meta, data=reader.stats.bytes_read)
    elif variant.startswith("floor"):
        out["bytes"] = out["data"] = sum(b.nbytes for _, _, b in buffers)
    out["digest"] = _digest(sd) if sd else ""
    return out


def needed(rank: int, world: int, path: str, case: str) -> int:
    """The saved bytes some destination box of the job covers, counted from the metadata and
    the destination layouts (rank 0 counts; the others answer 0)."""
    if rank:
        return 0
    from torch.distributed.tensor import DTensor

    from shardspec.checkpoint.dcp_metadata import read_metadata
    from shardspec.metadata.dtensor import from_dtensor
    from shardspec.reshard.frontends import sharded_tensor_layout
    from shardspec.reshard.index import BoxIndex

    md = read_metadata(path)
    total = 0
    for key, obj in _state(case, world, zero=True).items():
        layout = from_dtensor(obj) if isinstance(obj, DTensor) else sharded_tensor_layout(obj)[0]
        boxes = sorted({s.box for s in layout.shards if not s.box.is_empty})  # replicas once
        index = BoxIndex(boxes, layout.shape)
        saved = md.state_dict_metadata[key]
        for c in saved.chunks:
            chunk = Box(tuple(c.offsets), tuple(c.sizes))
            covered = sum(math.prod(sizes) for _, _, sizes in index.query_clipped(chunk))
            total += covered * saved.properties.dtype.itemsize
    return total


# ---------------------------------------------------------------- simulated worlds


class _ThreadClock:
    """Stands in for ``load``'s ``time`` module in the ``scale`` case: its phase clock reads
    the calling thread's CPU time."""

    perf_counter = staticmethod(time.thread_time)


def _sim_state(world: int, zero: bool) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard as DShard

    mesh = init_device_mesh("cpu", (world,))
    rank = mesh.get_coordinate()[0]  # type: ignore[index]
    out = {}
    for i in range(SIM_TENSORS):
        local = torch.zeros(SIM_ROWS, SIM_COLS)
        if not zero:
            local = _sim_full(world, i)[rank * SIM_ROWS : (rank + 1) * SIM_ROWS]
        out[f"t{i}"] = DTensor.from_local(local, mesh, [DShard(0)], run_check=False)
    return out


def _sim_full(world: int, i: int) -> torch.Tensor:
    n = SIM_ROWS * world * SIM_COLS
    return torch.arange(n, dtype=torch.float32).add_(i * 0.5).reshape(SIM_ROWS * world, SIM_COLS)


def sim_load(rank: int, world: int, path: str, variant: str) -> dict[str, Any]:
    """``load`` (reads="own") or ``dcp.load`` (ours) on a simulated rank: CPU seconds of the
    whole call, its phases (CPU, ``load`` only), wall seconds barrier to barrier, digest."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.collective_load import load as collective_load
    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    sd = _sim_state(world, zero=True)
    phases: dict[str, float] = {}
    dist.barrier()
    t0, c0 = time.perf_counter(), time.thread_time()
    if variant in ("load", "load-auto"):
        phases = collective_load(sd, path, reads="own" if variant == "load" else "auto").seconds
    else:
        dcp.load(sd, storage_reader=FileSystemReader(path), planner=LoadPlanner())
    cpu = time.thread_time() - c0
    dist.barrier()
    return {"cpu": cpu, "phases": phases, "wall": time.perf_counter() - t0, "digest": _digest(sd)}


def sim_checkpoint(path: str, world: int) -> None:
    """The ``scale`` checkpoint: saved by one process, rewritten into W row chunks."""
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.offline import reshard_checkpoint

    whole = {f"t{i}": _sim_full(world, i) for i in range(SIM_TENSORS)}
    dcp.save(whole, checkpoint_id=path + "-whole", no_dist=True)
    lay = chunk_layout((SIM_ROWS * world, SIM_COLS), 0, list(range(world)))
    reshard_checkpoint(path + "-whole", path, layouts=dict.fromkeys(whole, lay), progress="never")


class _PerRank(dict[Any, Any]):
    """A process cache kept per thread: each rank of a simulated world fills its own, as each
    process of a real job does."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def _mine(self) -> dict[Any, Any]:
        mine = getattr(self._local, "cache", None)
        if mine is None:
            mine = self._local.cache = {}
        return mine

    def get(self, key: Any, default: Any = None) -> Any:
        return self._mine().get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._mine()[key] = value

    def __len__(self) -> int:
        return len(self._mine())

    def clear(self) -> None:
        self._mine().clear()


def _per_rank_memo(fn: Callable[..., Any]) -> Callable[..., Any]:
    cache = _PerRank()

    def memo(*args: Any) -> Any:
        hit = cache.get(args)
        if hit is None:
            hit = cache[args] = fn(*args)
        return hit

    return memo


def measure_scale(tmp: Path, worlds: tuple[int, ...], dcp_upto: int) -> list[dict[str, Any]]:
    import shardspec.checkpoint.collective_load as load_module
    import shardspec.checkpoint.dcp as dcp_module
    import shardspec.checkpoint.load_exchange as exchange_module
    import shardspec.checkpoint.load_reads as reads_module
    import shardspec.metadata.dtensor as dtensor_module
    from shardspec.testing.simulated import get_simulated_pool, shutdown_simulated

    fn = f"{Path(__file__).stem}:sim_load"
    rows = []
    load_module.time = _ThreadClock  # type: ignore[assignment]
    # A real rank builds these once per process; the threads of a simulated world would
    # share them, so each thread keeps its own.
    saved = (
        dtensor_module._cached_mesh_layout,
        dcp_module._CHECKED,
        dcp_module._INDEXES,
        reads_module._REPLICATED,
        reads_module._WHOLE_READS,
        exchange_module._WHOLE,
    )
    dtensor_module._cached_mesh_layout = _per_rank_memo(dtensor_module.mesh_layout)  # type: ignore[assignment]
    dcp_module._CHECKED, dcp_module._INDEXES = _PerRank(), _PerRank()  # type: ignore[assignment]
    reads_module._REPLICATED = _PerRank()  # type: ignore[assignment]
    reads_module._WHOLE_READS = _PerRank()  # type: ignore[assignment]
    exchange_module._WHOLE = _PerRank()  # type: ignore[assignment]
    try:
        for w in worlds:
            path = str(tmp / f"sim-{w}")
            sim_checkpoint(path, w)
            pool = get_simulated_pool(w)
            limit = 600.0 + 2.0 * w
            row: dict[str, Any] = {"world": w}
            pool.call(fn, path, "load", timeout=limit)  # untimed: the world, meshes, caches
            res = pool.call(fn, path, "load", timeout=limit)
            row["load"] = res
            row["auto"] = pool.call(fn, path, "load-auto", timeout=limit)
            if [r["digest"] for r in row["auto"]] != [r["digest"] for r in res]:
                raise SystemExit(f"scale, W={w}: reads=auto and reads=own loaded different bytes")
            if w <= dcp_upto:
                row["dcp"] = pool.call(fn, path, "dcp", timeout=limit)
                if [r["digest"] for r in row["dcp"]] != [r["digest"] for r in res]:
                    raise SystemExit(f"scale, W={w}: load and dcp.load loaded different bytes")
            rows.append(row)
            print(f"  scale: W={w} done", file=sys.stderr, flush=True)
    finally:
        load_module.time = time  # type: ignore[assignment]
        (
            dtensor_module._cached_mesh_layout,
            dcp_module._CHECKED,
            dcp_module._INDEXES,
            reads_module._REPLICATED,
            reads_module._WHOLE_READS,
            exchange_module._WHOLE,
        ) = saved  # type: ignore[assignment]
        shutdown_simulated()
    return rows


# ---------------------------------------------------------------- driver side

_LOAD, _SAVE = f"{Path(__file__).stem}:load", f"{Path(__file__).stem}:save"
_NEEDED = f"{Path(__file__).stem}:needed"
_SHARED = f"{Path(__file__).stem}:shared_load"
SHARED_TIMED = ("load-own", "load-once", "floor")


def measure_shared(pool: RankPool, path: str, pipe: str, repeat: int) -> dict[str, Any]:
    """The ``shared`` case: own, once and the floor through the pipe, ``repeat`` times after
    one untimed run each, the order rotating; then ``reads="auto"`` told each storage kind."""
    for v in SHARED_TIMED:
        pool.call(_SHARED, path, pipe, v, None)
    runs: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in SHARED_TIMED}
    for i in range(repeat):
        k = i % len(SHARED_TIMED)
        for v in SHARED_TIMED[k:] + SHARED_TIMED[:k]:
            runs[v].append(pool.call(_SHARED, path, pipe, v, None))
    told = {s: pool.call(_SHARED, path, pipe, "load-auto", s) for s in ("shared", "local")}
    for r in range(pool.world_size):
        seen = {res[r]["digest"] for v in ("load-own", "load-once") for res in runs[v]}
        if len(seen | {told[s][r]["digest"] for s in told}) != 1:
            raise SystemExit(f"shared storage: rank {r} loaded different bytes")
    out: dict[str, Any] = {}
    for v in SHARED_TIMED:
        last = runs[v][-1]
        out[v] = {
            "seconds": statistics.median(max(x["seconds"] for x in res) for res in runs[v]),
            "job_bytes": sum(x["bytes"] for x in last),
            "phases": {
                p: statistics.median(max(x["phases"][p] for x in res) for res in runs[v])
                for p in last[0]["phases"]
            },
        }
    out["auto"] = {s: (told[s][0]["reads"], max(x["seconds"] for x in told[s])) for s in told}
    return out


def report_shared(name: str, r: dict[str, Any]) -> tuple[str, str]:
    """Print the ``shared`` case; (the faster of own and once, what auto took told shared)."""
    bw = SHARED_BANDWIDTH / 2**20
    print(f"\n{name}: simulated shared storage, one pipe of {bw:g} MiB/s for the whole job")
    print("(every data read of every rank waits for its slot); slowest rank, median")
    for v in SHARED_TIMED:
        ph = r[v]["phases"]
        phases = " / ".join(
            f"{ph.get(p, 0.0):.3f}" for p in ("metadata", "plan", "read", "exchange")
        )
        print(
            f"  {v:<10} {r[v]['seconds']:.3f}s  storage bytes per job {_mib(r[v]['job_bytes'])}"
            + (f"  phases m/p/r/x {phases}" if ph else "")
        )
    own, once = r["load-own"]["seconds"], r["load-once"]["seconds"]
    faster = "own" if own <= once else "once"
    for s, (mode, sec) in r["auto"].items():
        print(f"  auto told storage={s!r}: took {mode} (one untimed-order run: {sec:.3f}s)")
    return faster, r["auto"]["shared"][0]


def measure(
    pool: RankPool, path: str, case: str, repeat: int, default_repeat: int | None = None
) -> dict[str, Any]:
    """Every variant ``repeat`` times (DCP's default ``default_repeat`` times, if given)."""
    default_repeat = repeat if default_repeat is None else default_repeat
    runs: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in VARIANTS}
    # untimed: imports, page cache, allocator; not DCP's default, the slowest by far (minutes
    # on the grid), whose imports are ours' and whose files the others' runs cached
    first = {v: pool.call(_LOAD, path, case, v) for v in VARIANTS if v != "default"}
    auto = pool.call(_LOAD, path, case, "load-auto")
    for i in range(repeat):
        k = i % len(VARIANTS)
        for v in VARIANTS[k:] + VARIANTS[:k]:
            if v != "default" or i < default_repeat:
                runs[v].append(pool.call(_LOAD, path, case, v))
    for r in range(pool.world_size):  # every rank: every loader, every run, the same bytes
        timed = [res for v in LOADERS for res in runs[v]]
        seen = {res[r]["digest"] for res in [*timed, *(first[v] for v in LOADERS if v in first)]}
        if len(seen | {auto[r]["digest"]}) != 1:
            raise SystemExit(f"{case} on {pool.world_size} ranks: rank {r} loaded different bytes")
    out: dict[str, Any] = {"auto": auto[0]["reads"], "needed": pool.call(_NEEDED, path, case)[0]}
    out["auto_storage"] = auto[0]["storage"]
    for v in VARIANTS:
        last = runs[v][-1]
        phases = {
            p: statistics.median(max(x["phases"][p] for x in res) for res in runs[v])
            for p in last[0]["phases"]
        }
        out[v] = {
            "seconds": statistics.median(max(x["seconds"] for x in res) for res in runs[v]),
            "rss": max(x["rss"] for res in runs[v] for x in res),
            "rank_bytes": max(x["bytes"] for x in last),
            "job_bytes": sum(x["bytes"] for x in last) if last[0]["bytes"] >= 0 else -1,
            "job_data": sum(x["data"] for x in last) if last[0]["data"] >= 0 else -1,
            "moved": sum(x["moved"] for x in last),
            "phases": phases,
        }
    return out


def _mib(n: int) -> str:
    return "n/a" if n < 0 else f"{n / 2**20:.1f} MiB"


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "inf"


def report(rows: list[tuple[str, dict[str, Any]]], offline: list[tuple[str, float]]) -> None:
    print("shardspec.checkpoint.load (reads own / once) against dcp.load with our planner +")
    print("reader (ours) and DCP's default, the read floor (every file read once) and the")
    print("exchange floor (a2a: one all_to_all_single of load-once's per-pair bytes and its")
    print("broadcasts of whole tensors); slowest rank,")
    print("median; ratios in the same run")
    head = (
        "case",
        "load-own",
        "load-once",
        "ours",
        "default",
        "floor",
        "floor-W",
        "a2a",
        "ours/own",
        "ours/once",
        "own/floor",
        "own/flW",
        "once/floor",
        "auto",
    )
    fmt = "{:<30} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>10} {:>5}"
    print(fmt.format(*head))
    for name, r in rows:
        s = {v: r[v]["seconds"] for v in VARIANTS}
        print(
            fmt.format(
                name,
                *(f"{s[v]:.3f}s" for v in VARIANTS),
                _ratio(s["ours"], s["load-own"]),
                _ratio(s["ours"], s["load-once"]),
                _ratio(s["load-own"], s["floor"]),
                _ratio(s["load-own"], s["floor-W"]),
                _ratio(s["load-once"], s["floor"]),
                r["auto"],
            )
        )
    print("\nstorage bytes read (rank: the most one rank read; job: all ranks), data bytes per")
    print("job of load-once, the bytes it sent between ranks, and the saved bytes the job needs")
    head = (
        "case",
        "own/rank",
        "own/job",
        "once/rank",
        "once/job",
        "ours/rank",
        "ours/job",
        "floor/job",
        "once data",
        "once sent",
        "needed",
    )
    fmt = "{:<30}" + " {:>12}" * 10
    print(fmt.format(*head))
    for name, r in rows:
        own, once, ours = r["load-own"], r["load-once"], r["ours"]
        print(
            fmt.format(
                name,
                _mib(own["rank_bytes"]),
                _mib(own["job_bytes"]),
                _mib(once["rank_bytes"]),
                _mib(once["job_bytes"]),
                _mib(ours["rank_bytes"]),
                _mib(ours["job_bytes"]),
                _mib(r["floor"]["job_bytes"]),
                _mib(once["job_data"]),
                _mib(r["a2a"]["moved"]),
                _mib(r["needed"]),
            )
        )
    print("\npeak RSS above the start (the most of any rank); DCP's default reader: bytes n/a")
    fmt = "{:<30}" + " {:>12}" * len(VARIANTS)
    print(fmt.format("case", *(f"RSS {v}" for v in VARIANTS)))
    for name, r in rows:
        print(fmt.format(name, *(_mib(r[v]["rss"]) for v in VARIANTS)))
    print("\nload's phases (slowest rank per phase, median): metadata / plan / read / exchange")
    for name, r in rows:
        parts = []
        for v in ("load-own", "load-once"):
            ph = r[v]["phases"]
            times = (ph.get(p, 0.0) for p in ("metadata", "plan", "read", "exchange"))
            parts.append(f"{v[5:]}: " + " / ".join(f"{t:.3f}" for t in times))
        print(f"{name:<30} " + "   ".join(parts))
    for name, sec in offline:
        print(f"shardspec reshard {name}: {sec:.2f}s (once, one process)")


def report_scale(
    rows: list[dict[str, Any]], dcp_upto: int
) -> list[tuple[int, float, float, float]]:
    """Print the ``scale`` table; (W, load's metadata+plan CPU: the mean over ranks, the 99th
    percentile of the ranks but rank 0) per world."""
    print("\nscale: the protocol against W on simulated worlds (threads; per rank = CPU seconds,")
    print("mean over ranks; rank 0 parses the metadata file for all (CKPT-23) and does the")
    print("threaded group's copies, so its metadata+plan is apart, with the 99th percentile and")
    print("the most of the other ranks; caches of layouts and chunk checks per rank; auto m+p:")
    print('the mean with reads="auto", which decides the mode; wall = one serial world, all ranks)')
    head = (
        "W",
        "metadata",
        "plan",
        "meta+plan",
        "rank 0",
        "p99 other",
        "max other",
        "auto m+p",
        "read+exch",
        "load",
        "load wall",
        "dcp.load",
        "dcp wall",
        "dcp/load",
    )
    fmt = "{:>6} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9}"
    print(fmt.format(*head))
    out = []
    for row in rows:
        res = row["load"]

        def mean(f: Callable[[dict[str, Any]], float], res: list[dict[str, Any]] = res) -> float:
            return statistics.fmean(f(x) for x in res)

        md = mean(lambda x: x["phases"]["metadata"])
        pl = mean(lambda x: x["phases"]["plan"])
        rest = mean(lambda x: x["phases"]["read"] + x["phases"]["exchange"])
        both = [x["phases"]["metadata"] + x["phases"]["plan"] for x in res]
        others = sorted(both[1:]) or [0.0]
        p99 = others[min(len(others) - 1, math.ceil(0.99 * len(others)) - 1)]
        cpu = mean(lambda x: x["cpu"])
        auto = statistics.fmean(x["phases"]["metadata"] + x["phases"]["plan"] for x in row["auto"])
        wall = max(x["wall"] for x in res)
        if "dcp" in row:
            dcpu = statistics.fmean(x["cpu"] for x in row["dcp"])
            dwall = max(x["wall"] for x in row["dcp"])
            d = (f"{dcpu:.4f}s", f"{dwall:.2f}s", _ratio(dcpu, cpu))
        else:
            d = ("skipped", "", "")
        print(
            fmt.format(
                row["world"],
                f"{md:.4f}s",
                f"{pl:.4f}s",
                f"{md + pl:.4f}s",
                f"{both[0]:.4f}s",
                f"{p99:.4f}s",
                f"{max(both[1:], default=0.0):.4f}s",
                f"{auto:.4f}s",
                f"{rest:.4f}s",
                f"{cpu:.4f}s",
                f"{wall:.2f}s",
                *d,
            )
        )
        out.append((row["world"], md + pl, p99, auto))
    print(f"dcp.load runs on a simulated world (ours, timed up to W={dcp_upto}).")
    return out


def verdicts(
    rows: list[tuple[str, dict[str, Any]]], scale: list[tuple[int, float, float, float]]
) -> None:
    print("\nverdicts (targets of the issue; reported, not asserted)")

    def line(ok: bool, text: str) -> None:
        print(f"  [{'MET' if ok else 'NOT MET'}] {text}")

    for name, r in rows:
        # CKPT-25: these files are local (page-cached), where auto must not take the slower
        own, once = r["load-own"]["seconds"], r["load-once"]["seconds"]
        faster = "own" if own <= once else "once"
        picked = r["auto"] or "own"
        slower = r[f"load-{picked}"]["seconds"] / max(min(own, once), 1e-9)
        line(
            slower <= 1.1,
            f"{name}: auto took {picked} ({r['auto_storage'] or 'no'} storage), {slower:.2f}x "
            f"the faster mode (want <= 1.1x); the faster here was {faster} (own {own:.3f}s, "
            f"once {once:.3f}s)",
        )
    for name, r in rows:
        # once's phases against their floors, measured in the same run (issue 40): its
        # exchange against one all_to_all_single of the same per-pair bytes plus the same
        # broadcasts (a2a), its read against the read floor scaled to the bytes it reads
        once, ph = r["load-once"], r["load-once"]["phases"]
        if r["a2a"]["moved"]:
            x = ph.get("exchange", 0.0) / max(r["a2a"]["seconds"], 1e-9)
            line(
                x <= 1.25,
                f"{name}: reads=once's exchange {ph.get('exchange', 0.0):.3f}s, {x:.2f}x the "
                f"exchange floor {r['a2a']['seconds']:.3f}s (want <= 1.25x)",
            )
        floor = r["floor"]
        if floor["job_data"] > 0 and once["job_data"] > 0:
            scaled = floor["seconds"] * once["job_data"] / floor["job_data"]
            x = ph.get("read", 0.0) / max(scaled, 1e-9)
            line(
                x <= 1.5,
                f"{name}: reads=once's read {ph.get('read', 0.0):.3f}s, {x:.2f}x the read floor "
                f"of its {_mib(once['job_data'])} ({scaled:.3f}s; want <= 1.5x)"
                + (
                    "; under the floor: its large runs are mapped, and their pages are first "
                    "touched in the exchange's copies"
                    if x < 0.5
                    else ""
                ),
            )
            if x < 0.5 and r["a2a"]["moved"]:
                # A mapped read is paid in the exchange (its copies fault the file's pages
                # in): judged together, each phase at its own allowance.
                both = ph.get("read", 0.0) + ph.get("exchange", 0.0)
                allowed = 1.5 * scaled + 1.25 * r["a2a"]["seconds"]
                line(
                    both <= allowed,
                    f"{name}: reads=once's read and exchange together {both:.3f}s, "
                    f"{both / max(scaled + r['a2a']['seconds'], 1e-9):.2f}x the read floor of "
                    f"its bytes and the exchange floor together ({scaled:.3f}s + "
                    f"{r['a2a']['seconds']:.3f}s; want <= 1.5x the one + 1.25x the other, "
                    f"{allowed:.3f}s)",
                )
    for name, r in rows:
        auto = "load-" + (r["auto"] or "own")
        ratio = r["ours"]["seconds"] / r[auto]["seconds"]
        best = r["ours"]["seconds"] / min(r["load-own"]["seconds"], r["load-once"]["seconds"])
        if "tensors, 4 ->" in name or "chunks" in name:
            want = 5.0 if "tensors" in name else 3.0
            line(
                ratio >= want,
                f"{name}: load (auto = {r['auto']}) {ratio:.2f}x faster than "
                f"ours (want >= {want:g}x; best mode {best:.2f}x)",
            )
        if " on 4 rows" in name or "pre-resharded big" in name:
            f = r["load-own"]["seconds"] / r["floor"]["seconds"]
            fw = r["load-own"]["seconds"] / r["floor-W"]["seconds"]
            line(
                f <= 1.25,
                f"{name}: reads=own {f:.2f}x the read floor (want <= 1.25x; "
                f"{fw:.2f}x the floor with every rank reading 1/W of the files)",
            )
    for name, r in rows:
        data, need, stored = r["load-once"]["job_data"], r["needed"], r["load-once"]["job_bytes"]
        line(
            data == need,
            f"{name}: reads=once read {data:,} data bytes per job, "
            f"needed {need:,} (storage bytes per job {stored:,})",
        )
    for name, r in rows:
        if "replicated" in name:
            print(
                f"  {name}: storage bytes per job: load-once {_mib(r['load-once']['job_bytes'])},"
                f" load-own {_mib(r['load-own']['job_bytes'])}, ours "
                f"{_mib(r['ours']['job_bytes'])}, saved {_mib(r['needed'])}"
            )
    if len(scale) >= 2:
        w0, t0, b0, a0 = scale[0]
        for w, t, b, a in scale[1:]:
            allowed = math.log2(w) / math.log2(w0)
            for what, now, then in (
                ("mean", t, t0),
                ("99th percentile but rank 0", b, b0),
                ('mean, reads="auto"', a, a0),
            ):
                line(
                    now / then <= allowed,
                    f"protocol (metadata+plan CPU per rank, {what}) W={w0} -> {w}: "
                    f"{now / then:.2f}x (log W grows {allowed:.2f}x; W grows {w / w0:g}x)",
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed loads per variant (default 3, 9 for the 1 GiB and 10,000-chunk cases; quick 1)",
    )
    ap.add_argument("--quick", action="store_true", help="small cases: a smoke run, not figures")
    ap.add_argument(
        "--cases",
        default="many,cols,grid,big,rep,reps,shared,pre,scale",
        help="comma-separated subset of many, cols, grid, big, rep, reps, shared, pre, scale "
        "(default: all)",
    )
    ap.add_argument(
        "--worlds",
        default=",".join(map(str, SIM_WORLDS)),
        help=f"simulated world sizes of the scale case (default {','.join(map(str, SIM_WORLDS))})",
    )
    ap.add_argument("--dcp-upto", type=int, default=256, help="largest simulated W for dcp.load")
    ap.add_argument(
        "--shared-mib",
        type=int,
        default=None,
        help="the shared case's pipe, MiB/s for the whole job (default 1024; quick 64)",
    )
    args, _ = ap.parse_known_args()  # nox passes every benchmark the same arguments
    cases = set(args.cases.split(","))
    if args.shared_mib is not None and os.environ.get("SHARDSPEC_BENCH_SHARED_MIB") is None:
        os.environ["SHARDSPEC_BENCH_SHARED_MIB"] = str(args.shared_mib)  # the ranks inherit it
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.quick and not QUICK:
        os.environ["SHARDSPEC_BENCH_QUICK"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    repeat = args.repeat or (1 if QUICK else 3)
    # A 1 GiB load on 8 ranks over 2 cores takes 0.1-0.2 s and a median of 3 moved by 1.5x
    # from one run of the benchmark to the next (2026-11-28): 9 runs there, which cost little.
    # So do the 10,000-chunk loads (0.3-2 s each but DCP's default, which runs once): their
    # ratio moved from 2.6x to 3.8x between runs of 3 as the machine's speed drifted.
    big_repeat = args.repeat or (1 if QUICK else 9)
    rows: list[tuple[str, dict[str, Any]]] = []
    offline: list[tuple[str, float]] = []
    shared: tuple[str, dict[str, Any]] = ("", {})
    worlds = (
        {4} if cases & {"many", "cols", "grid", "big", "rep", "reps", "shared", "pre"} else set()
    )
    worlds |= {2} if cases & {"many", "big", "pre"} else set()
    worlds |= {8} if cases & {"big", "pre"} else set()
    gib = _size(math.prod(BIG_SHAPE) * 4)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        pools = {w: RankPool(w, timeout=1200) for w in sorted(worlds)}

        def run(
            name: str, w: int, path: str, case: str, repeat: int, slow: int | None = None
        ) -> None:
            print(f"  {name} ...", file=sys.stderr, flush=True)
            rows.append((name, measure(pools[w], path, case, repeat, slow)))

        try:
            many, big, rep = str(tmp / "many"), str(tmp / "big"), str(tmp / "rep")
            if cases & {"many", "pre"}:
                pools[4].call(_SAVE, many, "many")
            if "many" in cases:
                for w in (2, 4):
                    run(f"{N_TENSORS} tensors, 4 -> {w}", w, many, "many", repeat)
            if cases & {"grid", "cols"}:
                grid = str(tmp / "grid")
                pools[4].call(_SAVE, grid, "grid")
                for case, what in (("cols", "shift dim 2"), ("grid", "shift dims 1+2")):
                    if case in cases:  # DCP's default takes a minute a load here: run once
                        run(f"{GRID_CELLS**2} chunks, {what}", 4, grid, case, big_repeat, 1)
            if cases & {"big", "pre"}:
                pools[4].call(_SAVE, big, "big")
            if "big" in cases:
                run(f"{gib} on 4 rows -> 2 cols", 2, big, "big", big_repeat)
                run(f"{gib} on 4 rows -> 8 rows", 8, big, "big", big_repeat)
            size = _size(REP_TENSORS * math.prod(REP_SHAPE) * 4)
            if cases & {"rep", "shared"}:
                pools[4].call(_SAVE, rep, "rep")
            if "rep" in cases:
                run(f"{size} replicated on 4", 4, rep, "rep", repeat)
            if "shared" in cases:
                print(f"  {size} replicated on 4, shared storage ...", file=sys.stderr, flush=True)
                shared = (
                    f"{size} replicated on 4, shared",
                    measure_shared(pools[4], rep, str(tmp / "pipe"), repeat),
                )
            if cases & {"rep", "shared"}:
                shutil.rmtree(rep)  # its page cache goes before the pre cases
            if "reps" in cases:
                reps = str(tmp / "reps")
                pools[4].call(_SAVE, reps, "reps")
                each = math.prod(REPS_SHAPE) * 4 >> 10
                run(
                    f"{REPS_TENSORS} tensors of {each} KiB replicated on 4", 4, reps, "reps", repeat
                )
            if "pre" in cases:
                for case, src, w in (
                    ("pre-big", big, 8),
                    ("pre-big", big, 2),
                    ("pre-many", many, 2),
                ):
                    dst = str(tmp / f"{case}-{w}")
                    offline.append((f"{case} -> {w} ranks", reshard_offline(src, dst, case, w)))
                    n = big_repeat if case == "pre-big" else repeat
                    run(f"pre-resharded {case[4:]}, on {w}", w, dst, case, n)
        finally:
            for p in pools.values():
                p.close()
        scale = []
        if "scale" in cases:
            scale_rows = measure_scale(
                tmp, tuple(int(w) for w in args.worlds.split(",")), args.dcp_upto
            )
    report(rows, offline)
    picks = report_shared(*shared) if "shared" in cases else None
    if "scale" in cases:
        scale = report_scale(scale_rows, args.dcp_upto)
    verdicts(rows, scale)
    if picks is not None:
        faster, took = picks
        ok = "MET" if took == faster else "NOT MET"
        print(f"  [{ok}] {shared[0]}: auto told shared took {took}; the faster here was {faster}")


if __name__ == "__main__":
    main()
