"""Throughput of the rank pool: small examples per second at W = 1..4, against spawning a
fresh process group per example (the baseline, measured in the same run on a few examples).

    python conformance/bench_pool.py [--seconds 3] [--baseline 2]

Each example is one uneven ``all_to_all_single`` of a few float32 elements per rank pair,
checked against the single-process reference, which is what a distributed property test does.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardspec.testing import RankPool

OPS = ("conformance.ops",)


def example(world: int, rng: random.Random) -> tuple[list[list[int]], list[torch.Tensor]]:
    splits = [[rng.randint(0, 3) for _ in range(world)] for _ in range(world)]
    inputs = [torch.arange(sum(row), dtype=torch.float32) + 100 * r for r, row in enumerate(splits)]
    return splits, inputs


def check(pool: RankPool, splits: list[list[int]], inputs: list[torch.Tensor]) -> None:
    world = pool.world_size
    results = pool.run(
        "pool.all_to_all", {"splits": splits}, per_rank_tensors=[[t] for t in inputs]
    )
    for dst, r in enumerate(results):
        parts = []
        for src in range(world):
            start = sum(splits[src][:dst])
            parts.append(inputs[src][start : start + splits[src][dst]])
        want = torch.cat(parts)
        if not torch.equal(r.tensors[0], want):
            raise AssertionError(f"rank {dst}: {r.tensors[0]} != {want}")


def rate(world: int, seconds: float, rng: random.Random) -> tuple[float, float]:
    pool = RankPool(world, ops=OPS)
    t0 = time.perf_counter()
    pool.start()
    startup = time.perf_counter() - t0
    for _ in range(20):  # warm-up
        check(pool, *example(world, rng))
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        check(pool, *example(world, rng))
        n += 1
    per_s = n / (time.perf_counter() - t0)
    pool.close()
    return per_s, startup


def spawn_per_example(world: int, n: int, rng: random.Random) -> float:
    """Examples per second when each example starts (and stops) its own ranks."""
    t0 = time.perf_counter()
    for _ in range(n):
        with RankPool(world, ops=OPS) as pool:
            check(pool, *example(world, rng))
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per world size")
    parser.add_argument("--baseline", type=int, default=2, help="spawned examples at W=4")
    parser.add_argument("--max-world", type=int, default=4)
    args, _ = parser.parse_known_args()
    rng = random.Random(0)
    base = spawn_per_example(args.max_world, args.baseline, rng)
    print(
        f"rank pool throughput (uneven all_to_all_single + reference check, {os.cpu_count()} cores)"
    )
    print(f"baseline: spawn per example at W={args.max_world}: {base:.2f} examples/s")
    print(f"{'W':>3} {'examples/s':>11} {'vs spawn':>9} {'pool start-up':>14}")
    for world in range(1, args.max_world + 1):
        per_s, startup = rate(world, args.seconds, rng)
        print(f"{world:>3} {per_s:>11.0f} {per_s / base:>8.0f}x {startup:>13.1f}s")
    print("target: >= 150 examples/s at W=4")


if __name__ == "__main__":
    main()
