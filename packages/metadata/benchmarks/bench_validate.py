"""Validation speed: shardspec's Layout.validate() against torch's own validator.

Layouts: 1-D chunkings (n row chunks of an (n*3, 8) tensor) and 2-D grids (sqrt(n) x sqrt(n)
blocks), n = 1e3 .. 1e6. Upstream is `validate_non_overlapping_shards_metadata` on the same
layout as ShardMetadata (overlap only; ours also checks bounds, duplicates and coverage).
Upstream runs in a child process with a time limit, so a quadratic case reports "> limit"
instead of stalling the run. Reported as ratios upstream / ours, measured in this run.

    python bench_validate.py [--max-shards 1000000] [--upstream-limit 60]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import time

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


def _upstream(kind: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec._internals import (
        validate_non_overlapping_shards_metadata,
    )

    layout = chunking(n) if kind == "chunking" else grid(n)
    mds = [
        ShardMetadata(list(s.box.offsets), list(s.box.sizes), f"rank:{s.rank}/cpu")
        for s in layout.shards
    ]
    t = time.perf_counter()
    validate_non_overlapping_shards_metadata(mds)
    out.put(time.perf_counter() - t)


def upstream_seconds(kind: str, n: int, limit: float) -> float | None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_upstream, args=(kind, n, q), daemon=True)
    p.start()
    try:
        return float(q.get(timeout=limit + 30))  # +30: the child also builds the layout
    except Exception:
        return None
    finally:
        p.kill()
        p.join()


def ours_seconds(layout: Layout, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        layout.validate()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-shards", type=int, default=1_000_000)
    ap.add_argument("--upstream-limit", type=float, default=60.0)
    args = ap.parse_args()
    sizes = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.max_shards]
    print(
        "## validation: shardspec Layout.validate vs torch validate_non_overlapping_shards_metadata"
    )
    head = ("layout", "shards", "build s", "ours s", "torch s", "torch/ours")
    print("{:<10} {:>9} {:>8} {:>8} {:>9} {:>11}".format(*head))
    for kind in ("chunking", "grid"):
        for n in sizes:
            t = time.perf_counter()
            layout = chunking(n) if kind == "chunking" else grid(n)
            build = time.perf_counter() - t
            ours = ours_seconds(layout, repeat=3 if n <= 100_000 else 1)
            theirs = upstream_seconds(kind, n, args.upstream_limit)
            if theirs is None:
                up, ratio = f"> {args.upstream_limit:.0f}", f"> {args.upstream_limit / ours:.0f}x"
            else:
                up, ratio = f"{theirs:.4f}", f"{theirs / ours:.1f}x"
            print(
                f"{kind:<10} {len(layout.shards):>9} {build:>8.2f} {ours:>8.4f} {up:>9} "
                f"{ratio:>11}",
                flush=True,
            )


if __name__ == "__main__":
    main()
