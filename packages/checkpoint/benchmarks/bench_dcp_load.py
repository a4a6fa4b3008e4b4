"""Whole ``dcp.load``: shardspec's ``FileSystemReader`` + ``LoadPlanner`` against DCP's
default reader + planner and against the read floor, measured in the same run
(spec/09-checkpoint.md, CKPT-2, CKPT-13 to CKPT-17), and ``shardspec inspect``.

Cases, on local gloo ranks (a ``RankPool`` per world size, started once):

* ``many``  2,000 float32 tensors of 48 x 40, saved on 4 ranks row-chunked (DTensor
  ``Shard(0)``) and loaded column-chunked (``Shard(1)``) on 2 and on 4 ranks.
* ``cols`` / ``grid``  10,000 chunks: one uint8 tensor of 201 x 200 x 200 saved on 4 ranks as
  a 100 x 100 grid of (201, 2, 2) chunks (a ShardedTensor, 2,500 chunks per rank) and loaded
  on 4 ranks as the grid shifted by one in dim 2 (2 reads per local chunk) and in both cut
  dims (4 reads per local chunk). DCP's planner compares each local chunk with all 10,000
  saved ones and its reader ``torch.load``s a saved chunk once per read.
* ``big``  one 1 GiB float32 tensor (65,536 x 4,096) saved on 4 ranks as 4 row chunks, loaded
  on 2 ranks column-chunked (every rank needs half of every chunk) and on 8 ranks
  row-chunked (every rank needs half a chunk).
* ``pre``  checkpoints rewritten offline by ``shardspec reshard`` (timed once, in the driver)
  into the target layouts, loaded on their target world: ``big`` on 8 ranks (rows) and on 2
  (columns), ``many`` on 2.

Per load and variant, the slowest rank's wall time of ``dcp.load`` from a barrier to a
barrier (median of ``--repeat`` runs after one untimed run of each; the variants' order
rotates so none always runs first), and the rank's peak RSS above its RSS before the load
(sampled every 2 ms; destination tensors are allocated before). The floor is no ``dcp.load``:
the ranks read every file of the checkpoint once between them (rank r the files i with
i mod W == r, whole, into one buffer each, allocated and written before the clock starts as
the destinations are). The protocol is ``dcp.load`` with our planner and a reader that
reads nothing: what DCP's load costs around the data (metadata on every rank, planning, the
plan exchange, the final gather), which no reader can remove; ``reading`` is ours minus it.
Before anything is reported, every rank checks that both loaders loaded the same bytes.
Files are in the page cache after the untimed run: this measures the reading code, not the
disk.

``inspect``: ``shardspec inspect --no-layout`` on a synthetic 10,000-tensor checkpoint (4
chunks each), against DCP's own way to the same metadata (``pickle.load`` of ``.metadata``
plus its save-plan check ``_validate_global_plan``).

Other jobs may share the machine: run under the timing lock, and read the ratios (all sides
measured in the same run), not the absolute times::

    flock /tmp/shardspec-timing.lock python packages/checkpoint/benchmarks/bench_dcp_load.py
    python packages/checkpoint/benchmarks/bench_dcp_load.py --quick   # smoke run, small sizes
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import math
import os
import pickle
import statistics
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.testing import RankPool
from shardspec.testing.memory import peak_rss, reset_peak_rss, rss

# --quick (a smoke run) shrinks the cases; set in the environment so the spawned ranks see it.
QUICK = os.environ.get("SHARDSPEC_BENCH_QUICK") == "1"
N_TENSORS, TENSOR_SHAPE = (200 if QUICK else 2000), (48, 40)
GRID_CELLS = 20 if QUICK else 100  # cells of 2 in each of dims 1 and 2
GRID_SHAPE = (2 * GRID_CELLS + 1, 2 * GRID_CELLS, 2 * GRID_CELLS)
BIG_SHAPE = (1024 if QUICK else 65_536, 4096)  # float32: 16 MiB quick, 1 GiB


# ---------------------------------------------------------------- rank side


def _many(world: int, dim: int, zero: bool) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard as DShard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(N_TENSORS):
        full = torch.randn(TENSOR_SHAPE, generator=g)
        out[f"layer{i}.w"] = distribute_tensor(
            torch.zeros_like(full) if zero else full, mesh, [DShard(dim)], src_data_rank=None
        )
    return out


def _grid_layout(world: int, shift: tuple[int, int]) -> Layout:
    """(201, 200, 200) cut in dims 1 and 2 at every second index (offset by ``shift``, per
    dim); cell k of the row-major grid on rank ``k * world // cells``."""
    n0, n1 = GRID_SHAPE[:2]

    def spans(k: int) -> list[tuple[int, int]]:
        return list(pairwise(sorted({0, n1, *range(k, n1, 2)})))

    cells = [(a, b) for a in spans(shift[0]) for b in spans(shift[1])]
    return Layout(
        GRID_SHAPE,
        [
            Shard(Box((0, a0, b0), (n0, a1 - a0, b1 - b0)), k * world // len(cells))
            for k, ((a0, a1), (b0, b1)) in enumerate(cells)
        ],
    )


def _grid(world: int, shift: tuple[int, int], zero: bool) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.shard import Shard as TorchShard

    from shardspec.metadata.shard_metadata import to_sharded_tensor_metadata

    layout = _grid_layout(world, shift)
    full = torch.arange(torch.Size(GRID_SHAPE).numel(), dtype=torch.int64).remainder(251)
    full = full.to(torch.uint8).reshape(GRID_SHAPE)
    md = to_sharded_tensor_metadata(layout, torch.uint8)
    me = dist.get_rank()
    shards = [
        TorchShard(
            torch.zeros(s.box.sizes, dtype=torch.uint8) if zero else full[s.box.slices()].clone(), m
        )
        for s, m in zip(layout.shards, md.shards_metadata)
        if s.rank == me
    ]
    st = ShardedTensor._init_from_local_shards_and_global_metadata(shards, md)
    return {"grid": st}


def _big(world: int, dim: int, zero: bool) -> dict[str, Any]:
    """The 1 GiB tensor as a DTensor ``Shard(dim)``; each rank makes only its own rows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard as DShard

    from shardspec.metadata.dtensor import dtensor_local_box

    mesh = init_device_mesh("cpu", (world,))
    box = dtensor_local_box(BIG_SHAPE, mesh, [DShard(dim)], mesh.get_coordinate())
    if zero:
        local = torch.zeros(box.sizes)
    else:
        first = box.offsets[0] * BIG_SHAPE[1]
        local = torch.arange(first, first + math.prod(box.sizes), dtype=torch.float32)
        local = local.reshape(box.sizes)
    return {"big": DTensor.from_local(local, mesh, [DShard(dim)], run_check=False)}


def _state(case: str, world: int, zero: bool) -> dict[str, Any]:
    if case in ("many", "pre-many"):
        return _many(world, 1 if zero else 0, zero)
    if case in ("big", "pre-big"):
        # Saved as rows; loaded as columns on 2 ranks, as rows on 8.
        return _big(world, 1 if zero and world == 2 else 0, zero)
    # Loaded: the grid shifted by one in both cut dims (4 reads per local chunk), or in dim 2
    # only (columns read as shifted columns, 2 reads per local chunk).
    shift = (0, 0) if not zero else ((1, 1) if case == "grid" else (0, 1))
    return _grid(world, shift, zero)


def save(rank: int, world: int, path: str, case: str) -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import SavePlanner

    # Our save planner: DCP 2.13's own save check sweeps along dim 0 too (quadratic here).
    dcp.save(_state(case, world, zero=False), checkpoint_id=path, planner=SavePlanner())


def _digest(sd: dict[str, Any]) -> str:
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor

    h = hashlib.sha256()
    for k in sorted(sd):
        v = sd[k]
        parts = (
            [s.tensor for s in v.local_shards()] if isinstance(v, ShardedTensor) else [v.to_local()]
        )
        for t in parts:
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _RssPeak:
    """The peak RSS above the RSS at start. Where the kernel can reset its high-water mark,
    that mark, exact and free: a thread sampling every 2 ms woke 500 times a second in each
    of 8 ranks on 2 cores and took the interpreter lock from the load it measured. Elsewhere,
    sampled every 2 ms on a thread."""

    def __enter__(self) -> _RssPeak:
        self.base = self.peak = rss()
        self._kernel = reset_peak_rss()
        self._t: threading.Thread | None = None
        if not self._kernel:
            self._stop = threading.Event()
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: Any) -> None:
        if self._t is not None:
            self._stop.set()
            self._t.join()
        self.peak = max(self.peak, rss())
        if self._kernel:
            self.peak = max(self.peak, peak_rss() or 0)

    @property
    def above(self) -> int:
        return self.peak - self.base


def _floor_buffers(
    path: str, rank: int, world: int, suffix: str = ".distcp", spread: bool = False
) -> list[tuple[str, int, Any]]:
    """Rank ``rank``'s share of the files ending in ``suffix``, as (file, offset, buffer):
    whole files (i mod W == rank), or with ``spread`` its 1/W of their bytes (the files end to
    end, cut in W even ranges: every rank reads, as every rank of a load does). Each buffer is
    written once so that its pages exist before the clock starts, as the destination
    tensors' do."""
    files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(suffix)]
    if spread:
        sizes = [os.path.getsize(f) for f in files]
        total, start = sum(sizes), 0
        lo, hi = total * rank // world, total * (rank + 1) // world
        ranges = []
        for f, size in zip(files, sizes, strict=True):
            a, b = max(lo, start), min(hi, start + size)
            if a < b:
                ranges.append((f, a - start, b - a))
            start += size
    else:
        ranges = [(f, 0, os.path.getsize(f)) for f in files[rank::world]]
    return [
        (f, offset, torch.empty(n, dtype=torch.uint8).fill_(1).numpy()) for f, offset, n in ranges
    ]


def _read_floor(buffers: list[tuple[str, int, Any]]) -> None:
    for full, offset, buf in buffers:
        fd = os.open(full, os.O_RDONLY)
        try:
            view, at = memoryview(buf), offset
            while len(view):  # one call reads it all from the page cache; a loop if not
                n = os.preadv(fd, [view], at)
                if n <= 0:
                    raise OSError(f"{full}: short read at byte {at}")
                view, at = view[n:], at + n
        finally:
            os.close(fd)


def _no_read_reader(path: str) -> Any:
    """Our reader with a ``read_data`` that reads nothing: ``dcp.load``'s protocol (metadata,
    planning, plan exchange, the final gather) with our planner, without the data."""
    from torch.futures import Future

    from shardspec.checkpoint.dcp import FileSystemReader

    class NoRead(FileSystemReader):  # type: ignore[misc]
        def read_data(self, plan: Any, planner: Any) -> Future[None]:
            fut: Future[None] = Future()
            fut.set_result(None)
            return fut

    return NoRead(path)


def load(rank: int, world: int, path: str, case: str, variant: str) -> tuple[float, int, str]:
    """(seconds, peak RSS above the start, digest of the loaded local bytes) of one load:
    ``variant`` ours (our reader + planner), default (DCP's) or floor (read the files)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader as DcpReader

    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    sd = _state(case, world, zero=True)
    buffers = _floor_buffers(path, rank, world) if variant == "floor" else []
    dist.barrier()
    with _RssPeak() as rss:
        t0 = time.perf_counter()
        if variant == "floor":
            _read_floor(buffers)
        elif variant == "ours":
            dcp.load(sd, storage_reader=FileSystemReader(path), planner=LoadPlanner())
        elif variant == "protocol":
            dcp.load(sd, storage_reader=_no_read_reader(path), planner=LoadPlanner())
        else:
            dcp.load(sd, storage_reader=DcpReader(path), planner=DefaultLoadPlanner())
        dist.barrier()
        seconds = time.perf_counter() - t0
        # Untimed: a rank that left the barrier first would otherwise start hashing its tensors
        # and take the cores from the ranks still leaving it, whose clocks are still running.
        dist.barrier()
    return seconds, rss.above, "" if variant in ("floor", "protocol") else _digest(sd)


# ---------------------------------------------------------------- driver side

# The ranks import rank functions by name; this script's directory is on their sys.path.
_LOAD, _SAVE = f"{Path(__file__).stem}:load", f"{Path(__file__).stem}:save"


VARIANTS = ("ours", "default", "floor", "protocol")


def measure(pool: RankPool, path: str, case: str, repeat: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    peaks: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    digests: dict[str, list[str]] = {}
    for v in VARIANTS:  # untimed: imports, page cache, allocator
        pool.call(_LOAD, path, case, v)
    for i in range(repeat):
        k = i % len(VARIANTS)
        for v in VARIANTS[k:] + VARIANTS[:k]:
            res = pool.call(_LOAD, path, case, v)
            times[v].append(max(r[0] for r in res))
            peaks[v] = max(peaks[v], *(r[1] for r in res))
            digests[v] = [r[2] for r in res]
    if digests["ours"] != digests["default"]:
        raise SystemExit(f"{case} on {pool.world_size} ranks: the loaders loaded different bytes")
    return {v: (statistics.median(times[v]), peaks[v]) for v in VARIANTS}


def reshard_offline(src: str, dst: str, case: str, world: int) -> float:
    """``shardspec reshard`` of ``src`` into ``case``'s load layout on ``world`` ranks."""
    from shardspec.checkpoint.offline import reshard_checkpoint

    if case == "pre-big":  # the layout _state loads: columns on 2 ranks, rows otherwise
        layouts = {"big": chunk_layout(BIG_SHAPE, 1 if world == 2 else 0, list(range(world)))}
    else:
        lay = chunk_layout(TENSOR_SHAPE, 1, list(range(world)))
        layouts = {f"layer{i}.w": lay for i in range(N_TENSORS)}
    t0 = time.perf_counter()
    reshard_checkpoint(src, dst, layouts=layouts, max_memory=2**31)
    return time.perf_counter() - t0


def bench_inspect(tmp: Path, n: int) -> dict[str, float]:
    from torch.distributed.checkpoint.default_planner import _validate_global_plan
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    from shardspec.checkpoint.cli import main
    from shardspec.metadata.dcp import to_tensor_storage_metadata

    layout = chunk_layout((64, 32), 0, [0, 1, 2, 3])
    sdm, storage = {}, {}
    for i in range(n):
        md = to_tensor_storage_metadata(layout, torch.float32)
        sdm[f"layer{i}.w"] = md
        for j, c in enumerate(md.chunks):
            storage[MetadataIndex(f"layer{i}.w", c.offsets, j)] = _StorageInfo(
                f"__{j}_0.distcp", i * 2048, 2048
            )
    ck = tmp / "inspect"
    ck.mkdir()
    (ck / ".metadata").write_bytes(pickle.dumps(Metadata(sdm, storage_data=storage)))
    for j in range(len(layout.shards)):
        # inspect checks each data file's length (CKPT-8): sparse files of the right size.
        with open(ck / f"__{j}_0.distcp", "wb") as f:
            f.truncate(n * 2048)

    def upstream() -> None:
        with open(ck / ".metadata", "rb") as f:
            md = pickle.load(f)
        assert not _validate_global_plan([None, None], md)  # type: ignore[list-item]

    def ours() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["inspect", str(ck), "--no-layout", "--progress", "never"]) == 0

    def best(fn: Any, k: int = 3) -> float:
        out = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return min(out)

    ours()  # warm-up: imports
    return {"ours_s": best(ours), "default_s": best(upstream)}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="timed loads per variant (default 3)")
    ap.add_argument("--quick", action="store_true", help="small cases: a smoke run, not figures")
    ap.add_argument(
        "--cases",
        default="many,cols,grid,big,pre,inspect",
        help="comma-separated subset of many, cols, grid, big, pre, inspect (default: all)",
    )
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    if args.quick and not QUICK:
        os.environ["SHARDSPEC_BENCH_QUICK"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    rows: list[tuple[str, dict[str, Any]]] = []
    offline: list[tuple[str, float]] = []
    worlds = {4} | ({2} if cases & {"many", "big", "pre"} else set())
    worlds |= {8} if cases & {"big", "pre"} else set()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        pools = {w: RankPool(w, timeout=1200) for w in sorted(worlds)}
        try:
            many, big = str(tmp / "many"), str(tmp / "big")
            if cases & {"many", "pre"}:
                pools[4].call(_SAVE, many, "many")
            if cases & {"big", "pre"}:
                pools[4].call(_SAVE, big, "big")
            if "many" in cases:
                for w in (2, 4):
                    rows.append(
                        (
                            f"{N_TENSORS} tensors, 4 -> {w}",
                            measure(pools[w], many, "many", args.repeat),
                        )
                    )
            if cases & {"grid", "cols"}:
                grid = str(tmp / "grid")
                pools[4].call(_SAVE, grid, "grid")  # one checkpoint: both cases save alike
                for case, what in (("cols", "shift dim 2"), ("grid", "shift dims 1+2")):
                    if case in cases:
                        r = measure(pools[4], grid, case, 1)
                        rows.append((f"{GRID_CELLS**2} chunks, {what}", r))
            if "big" in cases:
                gib = f"{math.prod(BIG_SHAPE) * 4 / 2**30:g} GiB"
                rows.append(
                    (f"{gib} on 4 rows -> 2 cols", measure(pools[2], big, "big", args.repeat))
                )
                rows.append(
                    (f"{gib} on 4 rows -> 8 rows", measure(pools[8], big, "big", args.repeat))
                )
            if "pre" in cases:
                for case, src, w in (
                    ("pre-big", big, 8),
                    ("pre-big", big, 2),
                    ("pre-many", many, 2),
                ):
                    dst = str(tmp / f"{case}-{w}")
                    offline.append((f"{case} -> {w} ranks", reshard_offline(src, dst, case, w)))
                    rows.append(
                        (
                            f"pre-resharded {case[4:]}, on {w}",
                            measure(pools[w], dst, case, args.repeat),
                        )
                    )
        finally:
            for p in pools.values():
                p.close()
        ins = bench_inspect(tmp, 1000 if QUICK else 10_000) if "inspect" in cases else None
    print("dcp.load: ours (FileSystemReader + LoadPlanner), DCP's default reader + planner, the")
    print("read floor (every file read once, into buffers allocated and touched beforehand) and")
    print("the protocol (dcp.load with our planner and a reader that reads nothing); slowest")
    print("rank; ratios in the same run. reading = ours - protocol: the time our reader adds")
    head = (
        "case",
        "ours",
        "default",
        "floor",
        "protocol",
        "default/ours",
        "ours/floor",
        "reading/floor",
        "RSS ours",
        "RSS default",
    )
    print("{:<30} {:>8} {:>8} {:>8} {:>8} {:>12} {:>10} {:>13} {:>11} {:>12}".format(*head))
    for name, r in rows:
        (o, ro), (d, rd), (f, _), (pr, _) = r["ours"], r["default"], r["floor"], r["protocol"]
        print(
            f"{name:<30} {o:>7.3f}s {d:>7.3f}s {f:>7.3f}s {pr:>7.3f}s {d / o:>11.2f}x"
            f" {o / f:>9.2f}x {max(o - pr, 0.0) / f:>12.2f}x {_mib(ro):>11} {_mib(rd):>12}"
        )
    for name, sec in offline:
        print(f"shardspec reshard {name}: {sec:.2f}s (once, one process)")
    if ins is None:
        return
    ratio = ins["ours_s"] / ins["default_s"]
    print(
        f"\ninspect, {1000 if QUICK else 10000} tensors x 4 chunks: {ins['ours_s']:.2f}s; "
        f"DCP's pickle.load + _validate_global_plan {ins['default_s']:.2f}s "
        f"(ours / DCP's {ratio:.2f})"
    )


if __name__ == "__main__":
    main()
