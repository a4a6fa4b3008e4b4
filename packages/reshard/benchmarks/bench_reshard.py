"""Resharding benchmarks: shardspec.reshard against the baselines, measured in the same run.

Transfers (gloo, 2 and 4 ranks, one pool of ranks per world size): a float32 tensor from
Shard(0) to Shard(1), even and uneven shapes, and a 1000-tensor state dict, by

* ``floor``     one hand-written ``all_to_all_single`` (pack, send, unpack: the least work),
* ``shardspec`` ``shardspec.reshard.reshard`` / ``reshard_state_dict``,
* ``dtensor``   ``DTensor.redistribute`` (on CPU it falls back to all-gather + chunk),
* ``sharded``   ``ShardedTensor.reshard`` (skipped for uneven shapes: it hangs or aborts
  gloo there, RESHARD-1),
* ``dcp``       ``torch.distributed.checkpoint`` save, then load into the new layout (temp dir).

The cost of ``check_replicas=True`` (RESHARD-13): a tensor replicated on every rank, resharded
to Shard(1) by ``shardspec`` (replicas trusted) and ``check_replicas`` (every replica hashed
and the digests all-gathered first); its ratio to ``shardspec`` is the price of the check.

Reported per case: the best wall time over the repeats (each repeat's time is the slowest
rank's; the methods run in turn, after one untimed warm-up each, and the minimum is what
survives the load of a shared machine), its ratio to the floor and to shardspec, and the
peak RSS growth per rank (VmHWM after, minus VmRSS before, with the high-water mark reset
first). Then planning: one rank's plan for 1e5 x 1e5 shards
against a naive all-pairs planner at a smaller size.

    python packages/reshard/benchmarks/bench_reshard.py            # quick: 4 and 16 MiB
    python packages/reshard/benchmarks/bench_reshard.py --full     # 64 and 256 MiB
    python packages/reshard/benchmarks/bench_reshard.py --cases replicas  # RESHARD-13's cost
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# Large allocations are mmapped (and returned on free), so that each method's peak RSS is its
# own and not hidden by memory an earlier method left in the allocator.
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")

import torch
import torch.distributed as dist

from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.reshard import plan, reshard, reshard_state_dict
from shardspec.testing.memory import peak_rss, reset_peak_rss, rss

MiB = 1 << 20


# ---------------------------------------------------------------- memory


# ---------------------------------------------------------------- shapes and inputs


def tensor_shape(mib: int, world: int, even: bool) -> tuple[int, int]:
    n = int((mib * MiB // 4) ** 0.5)
    n -= n % (world * 4)
    return (n, n) if even else (n + 3, n - 5)  # n + 3 and n - 5: neither divides by 2 or 4


def local_rows(shape: tuple[int, ...], world: int, rank: int, dim: int) -> Box:
    return chunk_layout(shape, dim, range(world)).boxes_of(rank)[0]


# ---------------------------------------------------------------- methods (rank side)


def floor_all_to_all(local: torch.Tensor, shape: tuple[int, int], world: int) -> torch.Tensor:
    """Shard(0) -> Shard(1) by hand, the least work there is: copy each peer's columns once,
    straight into the send buffer; one all_to_all_single; the receive buffer is the output
    (rows arrive in rank order, already in place)."""
    rank = dist.get_rank()
    rows = chunk_layout(shape, 0, range(world))
    cols = [chunk_layout(shape, 1, range(world)).boxes_of(p)[0] for p in range(world)]
    n = local.shape[0]
    in_splits = [n * c.sizes[1] for c in cols]
    send = torch.empty(sum(in_splits), dtype=local.dtype)
    pos = 0
    for c, k in zip(cols, in_splits):
        send[pos : pos + k].view(n, c.sizes[1]).copy_(local[:, c.slices()[1]])
        pos += k
    mine = cols[rank]
    out_splits = [rows.boxes_of(p)[0].sizes[0] * mine.sizes[1] for p in range(world)]
    recv = torch.empty(sum(out_splits), dtype=local.dtype)
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    return recv.view(shape[0], mine.sizes[1])


def floor_state_dict(
    locals_: dict[str, torch.Tensor], shapes: dict[str, tuple[int, int]], world: int
) -> dict[str, torch.Tensor]:
    """The same for many tensors in one all_to_all_single: one copy in, one copy out."""
    rank = dist.get_rank()
    keys = sorted(locals_)
    rows = {k: chunk_layout(shapes[k], 0, range(world)) for k in keys}
    cols = {k: chunk_layout(shapes[k], 1, range(world)) for k in keys}
    in_splits = [
        sum(locals_[k].shape[0] * cols[k].boxes_of(p)[0].sizes[1] for k in keys)
        for p in range(world)
    ]
    out_splits = [
        sum(rows[k].boxes_of(p)[0].sizes[0] * cols[k].boxes_of(rank)[0].sizes[1] for k in keys)
        for p in range(world)
    ]
    send = torch.empty(sum(in_splits))
    pos = 0
    for p in range(world):
        for k in keys:
            c = cols[k].boxes_of(p)[0]
            n = locals_[k].shape[0] * c.sizes[1]
            send[pos : pos + n].view(-1, c.sizes[1]).copy_(locals_[k][:, c.slices()[1]])
            pos += n
    recv = torch.empty(sum(out_splits))
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    out = {k: torch.empty(rows[k].shape[0], cols[k].boxes_of(rank)[0].sizes[1]) for k in keys}
    pos = 0
    for p in range(world):
        for k in keys:
            r = rows[k].boxes_of(p)[0]
            width = out[k].shape[1]
            n = r.sizes[0] * width
            out[k][r.slices()[0]] = recv[pos : pos + n].view(-1, width)
            pos += n
    return out


def _mesh(world: int) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", list(range(world)))


def _dtensor(local: torch.Tensor, shape: tuple[int, ...], world: int) -> Any:
    from torch.distributed.tensor import DTensor, Shard as DShard

    return DTensor.from_local(
        local,
        _mesh(world),
        [DShard(0)],
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(shape, device="meta").stride(),
    )


def dtensor_redistribute(local: torch.Tensor, shape: tuple[int, ...], world: int) -> torch.Tensor:
    from torch.distributed.tensor import Shard as DShard

    dt = _dtensor(local, shape, world)
    return dt.redistribute(dt.device_mesh, [DShard(1)]).to_local()


def _sharded(local: torch.Tensor, shape: tuple[int, ...], world: int) -> Any:
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.shard import Shard as TShard

    from shardspec.metadata.shard_metadata import to_sharded_tensor_metadata

    layout = chunk_layout(shape, 0, range(world))
    md = to_sharded_tensor_metadata(layout, local.dtype)
    rank = dist.get_rank()
    mine = [m for s, m in zip(layout.shards, md.shards_metadata) if s.rank == rank]
    return ShardedTensor._init_from_local_shards_and_global_metadata([TShard(local, mine[0])], md)


def sharded_reshard(local: torch.Tensor, shape: tuple[int, ...], world: int) -> torch.Tensor:
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    st = _sharded(local, shape, world)
    spec = ChunkShardingSpec(dim=1, placements=[f"rank:{r}/cpu" for r in range(world)])  # type: ignore[arg-type]
    st.reshard(spec)
    return st.local_shards()[0].tensor


def dcp_roundtrip(
    state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], world: int, path: str
) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard as DShard

    mesh = _mesh(world)
    rank = dist.get_rank()
    src = {k: _dtensor(v, shapes[k], world) for k, v in state.items()}
    dcp.save(src, checkpoint_id=path)
    dst = {}
    for k, shp in shapes.items():
        box = chunk_layout(shp, 1, range(world)).boxes_of(rank)[0]
        dst[k] = DTensor.from_local(
            torch.empty(box.sizes),
            mesh,
            [DShard(1)],
            run_check=False,
            shape=torch.Size(shp),
            stride=torch.empty(shp, device="meta").stride(),
        )
    dcp.load(dst, checkpoint_id=path)
    return {k: v.to_local() for k, v in dst.items()}


def _timed_once(fn: Any) -> tuple[float, int, Any]:
    gc.collect()
    dist.barrier()
    before = rss()
    reset_peak_rss()
    t0 = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - t0
    growth = (peak_rss() or 0) - before
    dist.barrier()
    return elapsed, growth, out


def _run_table(table: dict[str, Any], methods: list[str], reps: int, same: Any) -> dict[str, Any]:
    """Every method once untimed (imports, first collectives, allocator), then ``reps``
    rounds that run the methods in turn, so that load from other processes on a shared
    machine falls on all of them alike."""
    results: dict[str, Any] = {m: {"times": [], "rss": 0, "same": True} for m in methods}
    ref = None
    for m in methods:
        out = table[m]()
        if ref is None:
            ref = out
        results[m]["same"] = same(out, ref)
        del out
    for _ in range(reps):
        for m in methods:
            elapsed, growth, out = _timed_once(table[m])
            del out
            results[m]["times"].append(elapsed)
            results[m]["rss"] = max(results[m]["rss"], growth)
    return results


def bench_tensor(
    rank: int, world: int, shape: tuple[int, int], methods: list[str], reps: int, tmp: str
) -> dict[str, Any]:
    torch.manual_seed(rank)
    box = local_rows(shape, world, rank, 0)
    local = torch.randn(box.sizes)
    src = chunk_layout(shape, 0, range(world))
    dst = chunk_layout(shape, 1, range(world))
    counter = itertools.count()

    def run_floor() -> torch.Tensor:
        return floor_all_to_all(local, shape, world)

    def run_ours() -> torch.Tensor:
        return reshard([local], src, dst)[0]

    def run_dtensor() -> torch.Tensor:
        return dtensor_redistribute(local, shape, world)

    def run_sharded() -> torch.Tensor:
        return sharded_reshard(local, shape, world)

    def run_dcp() -> torch.Tensor:
        path = os.path.join(tmp, f"t{world}-{next(counter)}")
        return dcp_roundtrip({"w": local}, {"w": shape}, world, path)["w"]

    table = {
        "floor": run_floor,
        "shardspec": run_ours,
        "dtensor": run_dtensor,
        "sharded": run_sharded,
        "dcp": run_dcp,
    }
    return _run_table(table, methods, reps, lambda a, b: bool(torch.equal(a, b)))


def bench_state_dict(
    rank: int, world: int, n: int, side: tuple[int, int], methods: list[str], reps: int, tmp: str
) -> dict[str, Any]:
    torch.manual_seed(rank)
    # Sizes vary but divide by the world size: ShardedTensor.reshard cannot do uneven ones.
    shapes = {
        f"layer{i:04d}.weight": (side[0] + 4 * (i % 3), side[1] + 4 * (i % 5)) for i in range(n)
    }
    state = {k: torch.randn(local_rows(s, world, rank, 0).sizes) for k, s in shapes.items()}
    src = {k: chunk_layout(s, 0, range(world)) for k, s in shapes.items()}
    dst = {k: chunk_layout(s, 1, range(world)) for k, s in shapes.items()}
    counter = itertools.count()

    def run_floor() -> dict[str, torch.Tensor]:
        return floor_state_dict(state, shapes, world)

    def run_ours() -> dict[str, torch.Tensor]:
        out = reshard_state_dict({k: [t] for k, t in state.items()}, src, dst)
        return {k: v[0] for k, v in out.items()}

    def run_dtensor() -> dict[str, torch.Tensor]:
        return {k: dtensor_redistribute(t, shapes[k], world) for k, t in state.items()}

    def run_sharded() -> dict[str, torch.Tensor]:
        return {k: sharded_reshard(t, shapes[k], world) for k, t in state.items()}

    def run_dcp() -> dict[str, torch.Tensor]:
        return dcp_roundtrip(state, shapes, world, os.path.join(tmp, f"sd{world}-{next(counter)}"))

    table = {
        "floor": run_floor,
        "shardspec": run_ours,
        "dtensor": run_dtensor,
        "sharded": run_sharded,
        "dcp": run_dcp,
    }
    return _run_table(table, methods, reps, lambda a, b: all(torch.equal(a[k], b[k]) for k in b))


def bench_replicas(rank: int, world: int, shape: tuple[int, int], reps: int) -> dict[str, Any]:
    torch.manual_seed(0)  # the same bytes on every rank: the replicas agree
    full = torch.randn(shape)
    src = Layout.replicated(shape, range(world))
    dst = chunk_layout(shape, 1, range(world))

    def run_trusted() -> torch.Tensor:
        return reshard([full], src, dst)[0]

    def run_checked() -> torch.Tensor:
        return reshard([full], src, dst, check_replicas=True)[0]

    table = {"shardspec": run_trusted, "check_replicas": run_checked}
    methods = list(table)
    return _run_table(table, methods, reps, lambda a, b: bool(torch.equal(a, b)))


# ---------------------------------------------------------------- planning


def naive_plan(src: Layout, dst: Layout) -> list[tuple[Box, int, int]]:
    """Every (source, destination) pair intersected: the O(n*m) baseline."""
    out = []
    for s in src.shards:
        for d in dst.shards:
            common = s.box.intersect(d.box)
            if common is not None:
                out.append((common, s.rank, d.rank))
    return out


def _best(fn: Any, reps: int = 3, fresh: Any = None) -> tuple[float, Any]:
    """Best of ``reps`` of ``fn(*fresh())``: ``fresh`` builds new layouts before each clock,
    since the planner keeps what it derives from a layout while the layout lives and these
    lines time a first plan (of layouts whose shards exist, as a repeat found them before)."""
    best, out = float("inf"), None
    for _ in range(reps):
        args = fresh() if fresh is not None else ()
        for layout in args:
            layout.shards  # noqa: B018 (made now if the layout holds rows; -O drops asserts)
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, out


def _rows_cols(n: int) -> tuple[Layout, Layout]:
    return chunk_layout((n, n), 0, range(n)), chunk_layout((n, n), 1, range(n))


def _grids(g: int) -> tuple[Layout, Layout]:
    cells = [(i, j) for i in range(g) for j in range(g)]
    grid = Layout.from_boxes(
        (g * 10, g * 10), [(Box((i * 10, j * 10), (10, 10)), i * g + j) for i, j in cells]
    )
    shifted = Layout.from_boxes(
        (g * 10, g * 10),
        [(Box((i * 10, j * 10), (10, 10)), (i * g + j + 7) % (g * g)) for i, j in cells],
    )
    return grid, shifted


def bench_planning(big: int, small: int) -> list[str]:
    lines = []
    rows, cols = _rows_cols(big)
    t_plan, p = _best(
        lambda a, b: plan(a, b, rank=12345 % big, validate=False), fresh=lambda: _rows_cols(big)
    )
    t_val, _ = _best(lambda: (rows.validate(), cols.validate()))
    lines.append(
        f"plan, one rank, {big:.0e} row chunks -> {big:.0e} column chunks: {t_plan:.3f} s "
        f"({len(p)} pieces; validating both layouts adds {t_val:.3f} s; best of 3)"
    )
    g = int(big**0.5)
    t_grid, p = _best(lambda a, b: plan(a, b, rank=3, validate=False), fresh=lambda: _grids(g))
    lines.append(
        f"plan, one rank, {g * g} x {g * g} grid cells, ranks shifted: {t_grid:.3f} s "
        f"({len(p)} pieces)"
    )
    rows_s, cols_s = _rows_cols(small)
    t0 = time.perf_counter()
    naive = naive_plan(rows_s, cols_s)
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = plan(rows_s, cols_s, validate=False)
    t_ours_all = time.perf_counter() - t0
    rows_s, cols_s = _rows_cols(small)  # a first plan of these layouts, as above
    t0 = time.perf_counter()
    plan(rows_s, cols_s, rank=1, validate=False)
    t_ours_one = time.perf_counter() - t0
    assert len(naive) == len(ours)
    lines.append(
        f"{small} x {small} shards: naive all-pairs {t_naive:.3f} s; ours, all ranks "
        f"{t_ours_all:.3f} s ({t_naive / t_ours_all:.1f}x faster, {len(ours)} pieces); "
        f"ours, one rank {t_ours_one:.4f} s ({t_naive / t_ours_one:.0f}x faster)"
    )
    return lines


# ---------------------------------------------------------------- driver


def _fmt(results: dict[str, Any], label: str) -> list[str]:
    med = {m: min(r["times"]) for m, r in results.items()}
    floor = med.get("floor")
    ours = med.get("shardspec")
    out = [f"  {label}"]
    for m, t in med.items():
        rss = max(results[m]["rss"])
        same = "" if all(results[m]["same"]) else "  (RESULT DIFFERS from the floor!)"
        vs_floor = f"{t / floor:6.2f}x floor" if floor else ""
        vs_ours = f"{t / ours:6.2f}x shardspec" if ours else ""
        out.append(
            f"    {m:14s} {t * 1e3:9.1f} ms  {vs_floor}  {vs_ours}  "
            f"peak RSS +{rss / MiB:7.1f} MiB/rank{same}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--full", action="store_true", help="64 and 256 MiB (default: quick, 4 and 16 MiB)"
    )
    ap.add_argument("--quick", action="store_true", help="the default: 4 and 16 MiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--methods", default="floor,shardspec,dtensor,sharded,dcp")
    ap.add_argument(
        "--cases",
        default="tensor,replicas,state_dict,planning",
        help="which cases run (comma-separated; all by default)",
    )
    args, _ = ap.parse_known_args()
    from shardspec.testing import RankPool

    sizes = [64, 256] if args.full else [4, 16]
    sd_side = (64, 64) if args.full else (16, 16)
    methods = args.methods.split(",")
    cases = set(args.cases.split(","))
    print(
        f"bench_reshard: {'full' if args.full else 'quick'} mode, sizes {sizes} MiB float32, "
        f"{args.reps} repeats, best of the max over ranks; gloo on {os.cpu_count()} cores"
    )
    tmp = tempfile.mkdtemp(prefix="bench_reshard_")
    # The ranks import this file by name (not as __main__), from its own folder.
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    me = Path(__file__).stem
    try:
        for world in [int(w) for w in args.worlds.split(",")]:
            pool = RankPool(world, timeout=900, env={"PYTHONPATH": path})
            try:
                print(f"\nworld size {world}")
                for mib in sizes if "tensor" in cases else []:
                    for even in (True, False):
                        shape = tensor_shape(mib, world, even)
                        ms = [m for m in methods if even or m != "sharded"]
                        per_rank = pool.call(f"{me}:bench_tensor", shape, ms, args.reps, tmp)
                        merged = {
                            m: {
                                "times": [
                                    max(r[m]["times"][i] for r in per_rank)
                                    for i in range(args.reps)
                                ],
                                "rss": [r[m]["rss"] for r in per_rank],
                                "same": [r[m]["same"] for r in per_rank],
                            }
                            for m in ms
                        }
                        kind = "even" if even else "uneven"
                        note = "" if even else " (sharded skipped: upstream hangs/aborts on uneven)"
                        print(
                            "\n".join(
                                _fmt(merged, f"{mib} MiB {shape} Shard(0)->Shard(1), {kind}{note}")
                            )
                        )
                for mib in sizes if "replicas" in cases else []:
                    shape = tensor_shape(mib, world, True)
                    per_rank = pool.call(f"{me}:bench_replicas", shape, args.reps)
                    merged = {
                        m: {
                            "times": [
                                max(r[m]["times"][i] for r in per_rank) for i in range(args.reps)
                            ],
                            "rss": [r[m]["rss"] for r in per_rank],
                            "same": [r[m]["same"] for r in per_rank],
                        }
                        for m in per_rank[0]
                    }
                    label = f"{mib} MiB {shape} replicated on every rank -> Shard(1)"
                    print("\n".join(_fmt(merged, label)))
                if "state_dict" not in cases:
                    continue
                n = 1000
                per_rank = pool.call(f"{me}:bench_state_dict", n, sd_side, methods, args.reps, tmp)
                merged = {
                    m: {
                        "times": [
                            max(r[m]["times"][i] for r in per_rank) for i in range(args.reps)
                        ],
                        "rss": [r[m]["rss"] for r in per_rank],
                        "same": [r[m]["same"] for r in per_rank],
                    }
                    for m in methods
                }
                print(
                    "\n".join(
                        _fmt(
                            merged,
                            f"state dict of {n} tensors ~{sd_side} (sizes vary), dim 0 -> dim 1",
                        )
                    )
                )
            finally:
                pool.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "planning" not in cases:
        return
    print("\nplanning")
    for line in bench_planning(100_000, 1000):
        print("  " + line)


if __name__ == "__main__":
    main()
