"""Whole ``dcp.load`` with shardspec's ``LoadPlanner`` against DCP's ``DefaultLoadPlanner``,
and ``shardspec inspect``, measured in the same run (spec/09-checkpoint.md, CKPT-2, CKPT-6).

Cases, on local gloo ranks (a ``RankPool`` per world size, started once):

* ``2000 tensors``  2,000 float32 tensors of 48 x 40, saved on 4 ranks row-chunked (DTensor
  ``Shard(0)``) and loaded column-chunked (``Shard(1)``) on 2 and on 4 ranks. Few chunks per
  tensor: planning is a small part of the load; ours must not make it slower.
* ``10000 chunks``  one uint8 tensor of 201 x 200 x 200 saved on 4 ranks as a 100 x 100 grid of
  (201, 2, 2) chunks (a ShardedTensor, 2,500 chunks per rank) and loaded on 4 ranks as the grid
  shifted by one in dim 2 (columns read as shifted columns: 10,100 chunks, 2 reads each) and
  as the grid shifted by one in both cut dims (10,201 chunks, 4 reads each). Every chunk spans
  dim 0, the dim DCP's sweep runs along, so DCP compares each local chunk with all 10,000
  saved ones either way: these are the planning-bound cases. The reads cost the same with
  either planner (DCP's ``read_data`` ``torch.load``s the whole saved chunk once per read), so
  the second case's 4 reads per chunk cap any planner's speed-up lower.

Per load: wall time of ``dcp.load`` from a barrier to a barrier, the slowest rank (median of
``--repeat`` runs after one untimed load with each, ours and the default interleaved, which
goes first alternating), and in a separate run the peak of the
Python heap during the load (``tracemalloc``, the slowest rank's; tensors are the same for
both planners and live outside it). Before anything is reported, every rank checks that both
planners loaded the same bytes. ``inspect``: ``shardspec inspect --no-layout`` on a synthetic
10,000-tensor checkpoint (4 chunks each), against DCP's own way to the same metadata
(``pickle.load`` of ``.metadata`` plus its save-plan check ``_validate_global_plan``).

Other jobs may share the machine: run under the timing lock, and read the ratios (both sides
measured in the same run), not the absolute times::

    flock /tmp/shardspec-timing.lock python packages/reshard/benchmarks/bench_dcp_load.py
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import pickle
import statistics
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.testing import RankPool

# --quick (a smoke run) shrinks the cases; set in the environment so the spawned ranks see it.
QUICK = os.environ.get("SHARDSPEC_BENCH_QUICK") == "1"
N_TENSORS, TENSOR_SHAPE = (200 if QUICK else 2000), (48, 40)
GRID_CELLS = 20 if QUICK else 100  # cells of 2 in each of dims 1 and 2
GRID_SHAPE = (2 * GRID_CELLS + 1, 2 * GRID_CELLS, 2 * GRID_CELLS)


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


def _state(case: str, world: int, zero: bool) -> dict[str, Any]:
    if case == "many":
        return _many(world, 1 if zero else 0, zero)
    # Loaded: the grid shifted by one in both cut dims (4 reads per local chunk), or in dim 2
    # only (columns read as shifted columns, 2 reads per local chunk).
    shift = (0, 0) if not zero else ((1, 1) if case == "grid" else (0, 1))
    return _grid(world, shift, zero)


def save(rank: int, world: int, path: str, case: str) -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.reshard.dcp import SavePlanner

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


def load(
    rank: int, world: int, path: str, case: str, ours: bool, trace: bool
) -> tuple[float, int, str]:
    """(seconds, Python heap peak bytes or 0, digest of the loaded local bytes)."""
    import tracemalloc

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from shardspec.reshard.dcp import LoadPlanner

    sd = _state(case, world, zero=True)
    planner = LoadPlanner() if ours else DefaultLoadPlanner()
    dist.barrier()
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    dcp.load(sd, checkpoint_id=path, planner=planner)
    dist.barrier()
    seconds = time.perf_counter() - t0
    peak = 0
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return seconds, peak, _digest(sd)


# ---------------------------------------------------------------- driver side

# The ranks import rank functions by name; this script's directory is on their sys.path.
_LOAD, _SAVE = f"{Path(__file__).stem}:load", f"{Path(__file__).stem}:save"


def measure(pool: RankPool, path: str, case: str, repeat: int) -> dict[str, Any]:
    times: dict[bool, list[float]] = {True: [], False: []}
    digests: dict[bool, list[str]] = {True: [], False: []}
    if repeat > 1:  # untimed: DCP's first load in a process imports and caches more
        for ours in (True, False):
            pool.call(_LOAD, path, case, ours, False)
    for i in range(repeat):
        # Which planner goes first alternates: the first load after another pays for warming
        # the page cache and the allocator, and must not always be the same planner's.
        for ours in (True, False) if i % 2 == 0 else (False, True):
            res = pool.call(_LOAD, path, case, ours, False)
            times[ours].append(max(r[0] for r in res))
            digests[ours] = [r[2] for r in res]
    if digests[True] != digests[False]:
        raise SystemExit(f"{case} on {pool.world_size} ranks: the planners loaded different bytes")
    peaks = {
        ours: max(r[1] for r in pool.call(_LOAD, path, case, ours, True)) for ours in (True, False)
    }
    return {
        "ours_s": statistics.median(times[True]),
        "default_s": statistics.median(times[False]),
        "ours_peak": peaks[True],
        "default_peak": peaks[False],
    }


def bench_inspect(tmp: Path, n: int) -> dict[str, float]:
    from torch.distributed.checkpoint.default_planner import _validate_global_plan
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    from shardspec.metadata.cli import main
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
    ap.add_argument("--repeat", type=int, default=3, help="timed loads per planner (default 3)")
    ap.add_argument("--quick", action="store_true", help="small cases: a smoke run, not figures")
    ap.add_argument(
        "--cases",
        default="many,cols,grid,inspect",
        help="comma-separated subset of many, cols, grid, inspect (default: all)",
    )
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    if args.quick and not QUICK:
        os.environ["SHARDSPEC_BENCH_QUICK"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        pools = {w: RankPool(w, timeout=1200) for w in ((2, 4) if "many" in cases else (4,))}
        try:
            if "many" in cases:
                many = str(tmp / "many")
                pools[4].call(_SAVE, many, "many")
                for w in (2, 4):
                    r = measure(pools[w], many, "many", args.repeat)
                    rows.append((f"{N_TENSORS} tensors, 4 -> {w} ranks", r))
            if cases & {"grid", "cols"}:
                grid = str(tmp / "grid")
                pools[4].call(_SAVE, grid, "grid")  # one checkpoint: both cases save alike
                for case, what in (("cols", "shift dim 2"), ("grid", "shift dims 1+2")):
                    if case in cases:
                        r = measure(pools[4], grid, case, 1)
                        rows.append((f"{GRID_CELLS**2} chunks, {what}", r))
        finally:
            for p in pools.values():
                p.close()
        ins = bench_inspect(tmp, 1000 if QUICK else 10_000) if "inspect" in cases else None
    print("dcp.load, LoadPlanner vs DefaultLoadPlanner (slowest rank; speed-up = default / ours)")
    head = ("case", "ours", "default", "speed-up", "heap ours", "heap default")
    print("{:<28} {:>9} {:>9} {:>9}   {:>11} {:>13}".format(*head))
    for name, r in rows:
        speed = r["default_s"] / r["ours_s"]
        print(
            f"{name:<28} {r['ours_s']:>8.2f}s {r['default_s']:>8.2f}s {speed:>8.2f}x"
            f"   {_mib(r['ours_peak']):>11} {_mib(r['default_peak']):>13}"
        )
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
