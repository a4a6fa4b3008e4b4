"""Validation speed: shardspec's Layout.validate() against torch's own checks.

Layouts: 1-D chunkings (n row chunks of an (n*3, 8) tensor) and 2-D grids (side x side blocks,
side = isqrt(n)), from 4 to 1e6 shards; from 1e3 shards also a brick wall (not a grid: the
guillotine path) and the faults a checker exists for: a chunking with a wrong offset (a shard
overlapping its neighbour), a chunking with a lost shard, a brick wall with a wrong offset.
Upstream is measured two ways on the same layout as ShardMetadata:
`validate_non_overlapping_shards_metadata` (overlap only), and that plus `check_tensor` (bounds
and total volume: what ShardedTensor runs, the nearest upstream has to our bounds + duplicates
+ disjointness + coverage). Upstream runs in a child process with a
time limit, so a quadratic case reports "> limit" instead of stalling the run.

A large Layout reads its boxes into arrays when it is built, so "build" is reported for both
sides too (ours: Layout from Shard objects; torch: the ShardMetadata list), and the last
column compares build + validate. Times are the best of several runs (one run at 1e6).
Ratios are upstream / ours, measured in this run: above 1 means ours is faster.

    python bench_validate.py [--max-shards 1000000] [--upstream-limit 60]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import math
import multiprocessing as mp
import time
from collections.abc import Callable
from functools import partial

from shardspec.metadata import Box, Layout, Shard


def chunking(n: int) -> Layout:
    return Layout((n * 3, 8), [Shard(Box((i * 3, 0), (3, 8)), i) for i in range(n)])


def grid(n: int) -> Layout:
    side = math.isqrt(n)
    return Layout(
        (side * 3, side * 2),
        [
            Shard(Box((i * 3, j * 2), (3, 2)), i * side + j)
            for i in range(side)
            for j in range(side)
        ],
    )


def brickwall(n: int) -> Layout:
    """Rows of bricks, odd rows shifted by half a brick: not a grid (TorchRec-like mixed
    cuts), so the guillotine path."""
    side = math.isqrt(n)
    shards = []
    for i in range(side):
        cuts = [0, *(4 * j + 2 * (i % 2) for j in range(1, side)), 4 * side]
        shards += [
            Shard(Box((2 * i, a), (2, b - a)), i * side + j)
            for j, (a, b) in enumerate(itertools.pairwise(cuts))
        ]
    return Layout((2 * side, 4 * side), shards)


def with_fault(layout: Layout, fault: str) -> Layout:
    """A wrong offset (a shard overlapping the ones after it) or a lost shard, mid-layout."""
    shards = list(layout.shards)
    mid = shards[len(shards) // 2]
    if fault == "overlap":
        offs = (mid.box.offsets[0] + 1, *mid.box.offsets[1:])
        sizes = (min(mid.box.sizes[0], layout.shape[0] - offs[0]), *mid.box.sizes[1:])
        shards.append(Shard(Box(offs, sizes), 0))
    else:
        shards.remove(mid)
    return Layout(layout.shape, shards)


LAYOUTS: dict[str, Callable[[int], Layout]] = {
    "chunking": chunking,
    "grid": grid,
    "brickwall": brickwall,
    "chunk+olap": lambda n: with_fault(chunking(n), "overlap"),
    "chunk-lost": lambda n: with_fault(chunking(n), "gap"),
    "brick+olap": lambda n: with_fault(brickwall(n), "overlap"),
}


def quietly(check: Callable[[], object]) -> Callable[[], None]:
    """``check`` with the error a faulty layout raises swallowed (both sides raise one)."""

    def run() -> None:
        with contextlib.suppress(ValueError):  # LayoutError is a ValueError, as torch's are
            check()

    return run


def build(
    shape: tuple[int, ...], raw: list[tuple[tuple[int, ...], tuple[int, ...], int]]
) -> Layout:
    return Layout(shape, [Shard(Box(o, z), r) for o, z, r in raw])


def best_of(fn: Callable[[], object], n: int) -> float:
    """Best time per call: enough calls per run to be well above the clock's resolution. The
    garbage collector is off while timing (as in timeit): its passes cost in proportion to
    everything else alive in the process, which differs between the two sides."""
    calls = max(1, 20_000 // n)
    best = math.inf
    gc.collect()
    gc.disable()
    try:
        for _ in range(5 if n <= 100_000 else 1):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t) / calls)
    finally:
        gc.enable()
    return best


def _upstream(kind: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec._internals import (
        check_tensor,
        validate_non_overlapping_shards_metadata,
    )

    layout = LAYOUTS[kind](n)
    boxes = [(list(s.box.offsets), list(s.box.sizes), f"rank:{s.rank}/cpu") for s in layout.shards]
    mds = [ShardMetadata(o, z, p) for o, z, p in boxes]
    build = best_of(lambda: [ShardMetadata(o, z, p) for o, z, p in boxes], n)
    out.put(build)
    overlap = best_of(quietly(lambda: validate_non_overlapping_shards_metadata(mds)), n)
    out.put(overlap)
    check = best_of(quietly(lambda: check_tensor(mds, list(layout.shape))), n)
    out.put(overlap + check)


def upstream_seconds(kind: str, n: int, limit: float) -> tuple[float | None, ...]:
    """(build, overlap-only, overlap + check_tensor); None for what did not finish in time."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_upstream, args=(kind, n, q), daemon=True)
    p.start()
    results: list[float | None] = [None, None, None]
    try:
        for i in range(3):  # +30: the child also builds the layout first
            results[i] = float(q.get(timeout=limit + 30))
    except Exception:
        pass
    finally:
        p.kill()
        p.join()
    return tuple(results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-shards", type=int, default=1_000_000)
    ap.add_argument("--upstream-limit", type=float, default=60.0)
    args = ap.parse_args()
    sizes = [n for n in (4, 16, 64, 256, 1_000, 10_000, 100_000, 1_000_000) if n <= args.max_shards]
    print("## validation: shardspec Layout.validate vs torch's shard metadata checks")
    print("(torch/ours > 1: ours is faster; 'overlap' is upstream's overlap check alone,")
    print(" 'full' adds check_tensor; build+val compares building the layout and validating)")
    head = (
        "layout", "shards", "ours build", "ours val", "torch build", "overlap", "full",
        "overlap/ours", "full/ours", "build+val",
    )  # fmt: skip
    row = "{:<9} {:>8} {:>10} {:>10} {:>11} {:>10} {:>10} {:>12} {:>9} {:>9}"
    print(row.format(*head))
    for kind in LAYOUTS:
        for n in sizes:
            if kind != "chunking" and kind != "grid" and n < 1000:
                continue  # the faulty and brick-wall layouts are about scale
            made = LAYOUTS[kind](n)
            raw = [(s.box.offsets, s.box.sizes, s.rank) for s in made.shards]
            ours_build = best_of(partial(build, made.shape, raw), n)
            layout = build(made.shape, raw)
            ours = best_of(quietly(layout.validate), n)
            theirs_build, overlap, full = upstream_seconds(kind, n, args.upstream_limit)

            def sec(x: float | None) -> str:
                return f"> {args.upstream_limit:.0f}s" if x is None else f"{x * 1e3:.3f}ms"

            def ratio(x: float | None, ours: float) -> str:
                return f"> {args.upstream_limit / ours:.0f}x" if x is None else f"{x / ours:.2f}x"

            both = None if theirs_build is None or full is None else theirs_build + full
            cells = [kind, len(layout.shards), sec(ours_build), sec(ours), sec(theirs_build)]
            cells += [sec(overlap), sec(full), ratio(overlap, ours), ratio(full, ours)]
            cells += [ratio(both, ours_build + ours)]
            print(row.format(*cells), flush=True)


if __name__ == "__main__":
    main()
