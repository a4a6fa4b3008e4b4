"""Throughput of the rank runtime: small examples per second, pooled at W = 1..4, launched at
W = 4 (torchrun, 5 processes), simulated at W = 64 and 1024, against spawning a fresh process
group per example (the baseline, measured in the same run on a few examples).

    python conformance/bench/pool.py [--seconds 3] [--baseline 2] [--no-launched]

Each example is one uneven ``all_to_all_single`` of a few float32 elements per rank pair,
checked against the single-process reference, which is what a distributed property test does.
Simulated worlds send to 3 random peers per rank (a resharding talks to few peers; a dense
W x W exchange at W = 1024 is a million copies).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conformance import OPS
from shardspec.testing import RankPool


def example(
    world: int, rng: random.Random, peers: int | None = None
) -> tuple[list[list[int]], list[torch.Tensor]]:
    if peers is None:
        splits = [[rng.randint(0, 3) for _ in range(world)] for _ in range(world)]
    else:
        splits = [[0] * world for _ in range(world)]
        for row in splits:
            for j in rng.sample(range(world), min(peers, world)):
                row[j] = rng.randint(1, 3)
    inputs = [torch.arange(sum(row), dtype=torch.float32) + 100 * r for r, row in enumerate(splits)]
    return splits, inputs


def check(pool: Any, splits: list[list[int]], inputs: list[torch.Tensor]) -> None:
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


def rate(
    world: int, seconds: float, rng: random.Random, pool: Any = None, peers: int | None = None
) -> tuple[float, float]:
    pool = RankPool(world, ops=OPS) if pool is None else pool
    t0 = time.perf_counter()
    pool.start()
    startup = time.perf_counter() - t0
    for _ in range(2 if peers else 20):  # warm-up
        check(pool, *example(world, rng, peers))
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or n == 0:
        check(pool, *example(world, rng, peers))
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
    parser.add_argument("--no-launched", action="store_true", help="skip the torchrun run")
    parser.add_argument("--launched-driver", action="store_true", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.launched_driver:  # inside torchrun: this process drives launcher ranks 1..4
        from shardspec.testing import get_pool

        per_s, startup = rate(4, args.seconds, random.Random(0), get_pool(4, ops=OPS))
        print(f"LAUNCHED {per_s:.1f} {startup:.2f}")
        return
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
    if not args.no_launched:
        per_s, startup = launched(args.seconds)
        print(f"{'4L':>3} {per_s:>11.0f} {per_s / base:>8.0f}x {startup:>13.1f}s  (launched)")
    from shardspec.testing.simulated import SimulatedPool

    for world in (64, 1024):
        sim = SimulatedPool(world, ops=OPS)
        per_s, startup = rate(world, args.seconds, rng, sim, peers=3)
        sim.close()
        print(f"{world:>3} {per_s:>11.2f} {per_s / base:>8.1f}x {startup:>13.1f}s  (simulated)")
    print("target: >= 150 examples/s at W=4")


def launched(seconds: float) -> tuple[float, float]:
    """Examples per second of a launched pool of 4 (torchrun, 5 processes, gloo)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=5",
        "-m",
        "shardspec.testing.launched",
        "--script",
        os.path.abspath(__file__),
        "--launched-driver",
        f"--seconds={seconds}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("LAUNCHED "))
    _, per_s, startup = line.split()
    return float(per_s), float(startup)


if __name__ == "__main__":
    main()
