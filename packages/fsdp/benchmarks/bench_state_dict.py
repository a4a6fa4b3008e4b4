"""A 2,000-tensor state dict on 4 gloo ranks: what building its layouts costs next to the
reshard itself, the first reshard against a warm one, and the whole of it against DTensor
tensor by tensor.

    python packages/fsdp/benchmarks/bench_state_dict.py [--tensors 2000] [--reps 3]

Reported as ratios measured in the same run (the machine may be shared):

* layouts from DTensors (``from_dtensor`` of every source DTensor and ``dtensor_layout`` of
  every destination), from chunk rules (``chunk_layout``) and from a model's shapes
  (``shardspec.fsdp.model_layouts``), each against one warm ``reshard_state_dict`` of the
  whole dict (target: at most 10%);
* the first ``reshard_state_dict`` in a fresh process against a warm one (target: within 2x);
* ours, layouts and DTensor wrapping included, against ``DTensor.redistribute`` of every
  tensor, ``Shard(0) -> Shard(1)`` on a 1-D mesh of 4.

Each figure is the best of ``--reps`` rounds of the slowest rank.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

WORLD = 4


def _shapes(n: int) -> dict[str, tuple[int, int]]:
    # Sizes vary (7 kinds, some uneven over 4 ranks), as a model's layers do.
    return {
        f"layers.{i // 7}.w{i % 7}.weight": (16 + 3 * (i % 3), 16 + 5 * (i % 5)) for i in range(n)
    }


def _timed(fn: Any) -> tuple[float, Any]:
    gc.collect()
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - t0
    dist.barrier()
    return elapsed, out


def bench(rank: int, world: int, n: int, reps: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from shardspec.fsdp import model_layouts
    from shardspec.metadata import chunk_layout, dtensor_layout, from_dtensor
    from shardspec.reshard import reshard_state_dict

    mesh = init_device_mesh("cpu", (world,))
    shapes = _shapes(n)
    torch.manual_seed(0)
    full = {k: torch.randn(s) for k, s in shapes.items()}
    src_dt = {k: distribute_tensor(t, mesh, [Shard(0)]) for k, t in full.items()}

    def layouts_from_dtensors() -> tuple[dict[str, Any], dict[str, Any]]:
        src = {k: from_dtensor(v) for k, v in src_dt.items()}
        dst = {k: dtensor_layout(s, mesh, [Shard(1)]) for k, s in shapes.items()}
        return src, dst

    def layouts_from_chunks() -> tuple[dict[str, Any], dict[str, Any]]:
        ranks = range(world)
        src = {k: chunk_layout(s, 0, ranks) for k, s in shapes.items()}
        dst = {k: chunk_layout(s, 1, ranks) for k, s in shapes.items()}
        return src, dst

    def layouts_from_model() -> dict[str, Any]:
        return model_layouts(shapes, {}, dp=world, tp_size=1)

    local = {k: [v.to_local()] for k, v in src_dt.items()}
    src, dst = layouts_from_dtensors()

    def ours_reshard() -> dict[str, list[torch.Tensor]]:
        return reshard_state_dict(local, src, dst)

    # The first call of this process, before anything else has planned or moved data.
    first, moved = _timed(ours_reshard)
    ok = all(torch.equal(moved[k][0], full[k][dst[k].boxes_of(rank)[0].slices()]) for k in full)

    def ours_total() -> dict[str, Any]:
        s, d = layouts_from_dtensors()
        out = reshard_state_dict({k: [v.to_local()] for k, v in src_dt.items()}, s, d)
        return {
            k: DTensor.from_local(
                out[k][0], mesh, [Shard(1)], run_check=False, shape=v.shape, stride=v.stride()
            )
            for k, v in src_dt.items()
        }

    def dtensor_total() -> dict[str, Any]:
        return {k: v.redistribute(mesh, [Shard(1)]) for k, v in src_dt.items()}

    table = {
        "reshard (warm)": ours_reshard,
        "layouts from DTensors": layouts_from_dtensors,
        "layouts from chunk rules": layouts_from_chunks,
        "layouts from a model": layouts_from_model,
        "ours, layouts included": ours_total,
        "DTensor.redistribute each": dtensor_total,
    }
    for fn in table.values():  # once untimed: imports, first collectives, allocator
        fn()
    same = all(
        torch.equal(a.to_local(), b.to_local())
        for a, b in zip(ours_total().values(), dtensor_total().values())
    )
    times: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(reps):
        for name, fn in table.items():  # in turn, so that outside load falls on all alike
            times[name].append(_timed(fn)[0])
    return {"first": first, "times": times, "ok": ok and same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    args, _ = ap.parse_known_args()
    from shardspec.testing import RankPool

    print(
        f"bench_state_dict: {args.tensors} tensors on {WORLD} gloo ranks, Shard(0) -> Shard(1), "
        f"best of {args.reps} (slowest rank); {os.cpu_count()} cores, possibly shared"
    )
    # The ranks import this file by name (not as __main__), from its own folder.
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    with RankPool(WORLD, timeout=1800, env={"PYTHONPATH": path}) as pool:
        per_rank = pool.call(f"{Path(__file__).stem}:bench", args.tensors, args.reps)
    first = max(r["first"] for r in per_rank)
    best = {
        name: min(max(r["times"][name][i] for r in per_rank) for i in range(args.reps))
        for name in per_rank[0]["times"]
    }
    warm = best["reshard (warm)"]
    print(f"  results equal the reference and DTensor's: {all(r['ok'] for r in per_rank)}")
    for name, t in best.items():
        print(f"  {name:28s} {t:8.4f} s   {t / warm:6.3f} x the warm reshard")
    print(f"  {'first reshard (cold)':28s} {first:8.4f} s   {first / warm:6.3f} x the warm reshard")
    ratio = best["DTensor.redistribute each"] / best["ours, layouts included"]
    print(f"  DTensor tensor by tensor / ours (layouts included): {ratio:.2f}x")
    layouts = max(best[k] for k in best if k.startswith("layouts")) / warm
    print(
        f"  targets: layouts <= 0.10 x warm: {'met' if layouts <= 0.10 else 'MISSED'} "
        f"({layouts:.3f}); first <= 2 x warm: {'met' if first / warm <= 2 else 'MISSED'} "
        f"({first / warm:.2f})"
    )


if __name__ == "__main__":
    main()
