"""Megatron-Core's refit (``megatron.core.resharding``) beside ``shardspec.refit`` on Megatron's
own ground: the same parameters between two TP x DP grids (issue 39's "Megatron-Core beside
them"). Both run on the same layouts; Megatron's metadata is derived from them as the suite's
adapter derives it (``rosters.py``), and ratios are taken within one run.

* **planning**, on simulated worlds (``--worlds``, default 8-1024; no process group): the
  first half of the ranks trains in TP 2 x DP, the second half serves in TP 4 x DP, a
  Megatron-style model of 2 layers (column-parallel ``linear_qkv``, row-parallel
  ``linear_proj`` and ``linear_fc2``, ``linear_fc1`` packing gate and up as
  ``partition_sizes``, whole layer norms, a column-parallel embedding). Per rank (a training
  and a serving one, the slower; best of ``--reps``): ``build_plan_from_rosters`` on rosters
  already gathered (Megatron's ``all_gather_object`` of every rank's metadata to every rank
  comes on top, and is not timed) and ``shardspec.refit.plan_refit`` with the reshard plan of
  each of its jobs (the pieces this rank sends and receives, as Megatron's plan lists its ops).
* **transfer**: that model with ``--layers`` layers of width ``--dim`` in bfloat16 from TP 4
  on 4 colocated gloo ranks into TP 2 x DP 2 on the same ranks, each plan built once and
  reused: Megatron's ``execute_reshard_plan`` with its gloo copy service, ``shardspec.refit``,
  and the floor (one ``all_to_all_single`` of the bytes the refit moves between distinct
  ranks, its buffers made before the clock). Slowest rank from a barrier to a barrier, median
  of ``--repeat`` after an untimed run; before anything is reported every rank checks that
  both left the same bits.

Needs Megatron-Core 0.19.2 (the venv of ``nox -s peers_megatron``); elsewhere it says so and
exits 0. Run alone (under the timing lock)::

    flock /tmp/shardspec-timing.lock .nox/torch-2.13.0-megatron-0.19.2/bin/python \\
        conformance/peers/megatron/bench.py
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from shardspec.metadata import Layout

WORLD = 4


def model(layers: int, dim: int, train: list[int], t_src: int, serve: list[int], t_dst: int
          ) -> tuple[Any, dict[str, Layout], dict[str, Layout]]:  # fmt: skip
    """The recipe (every parameter as it is) and both sides' layouts."""
    from conformance.strategies.refit import tp_layout
    from shardspec.refit import Source, Target, recipe

    params: dict[str, tuple[tuple[int, int] | tuple[int], int, list[int]]] = {
        "embedding.word_embeddings.weight": ((8 * dim, dim), 0, [8 * dim])
    }
    for i in range(layers):
        p = f"decoder.layers.{i}."
        params[p + "self_attention.linear_qkv.weight"] = ((2 * dim, dim), 0, [2 * dim])
        params[p + "self_attention.linear_proj.weight"] = ((dim, dim), 1, [dim])
        params[p + "mlp.linear_fc1.weight"] = ((4 * dim, dim), 0, [2 * dim, 2 * dim])
        params[p + "mlp.linear_fc2.weight"] = ((dim, 2 * dim), 1, [2 * dim])
        params[p + "input_layernorm.weight"] = ((dim,), -1, [])
    src, dst = {}, {}
    for n, (shape, d, parts) in params.items():
        if d < 0:
            src[n], dst[n] = Layout.replicated(shape, train), Layout.replicated(shape, serve)
        else:
            src[n] = tp_layout(shape, d, parts, train, t_src)
            dst[n] = tp_layout(shape, d, parts, serve, t_dst)
    return recipe(Target(n, Source(n)) for n in params), src, dst


def _megatron_rosters(r: Any, src: dict[str, Layout], dst: dict[str, Layout], world: int) -> Any:
    from megatron.core.resharding import index_metadata_rosters  # type: ignore[import-not-found]

    from conformance.peers.megatron.refit_ops import metadata
    from conformance.peers.megatron.rosters import rosters

    meta = rosters(r, src, dst, dict.fromkeys(src, "bfloat16"), world)
    gathered = [
        tuple([metadata(m, rank, world) for m in mine[side]] for side in ("src", "dst"))
        for rank, mine in enumerate(meta)
    ]
    return index_metadata_rosters(gathered)


def bench_planning(worlds: list[int], reps: int) -> list[tuple[int, float, float, int, int]]:
    """(world, ours, Megatron's: the slower of a training and a serving rank's best, and the
    two plans' op counts on that serving rank)."""
    from megatron.core.resharding import build_plan_from_rosters  # type: ignore[import-not-found]

    from shardspec.refit import plan_refit
    from shardspec.reshard import plan as reshard_plan

    rows = []
    for w in worlds:
        half = w // 2
        r, src, dst = model(2, 1024, list(range(half)), 2, list(range(half, w)), min(4, half))
        for layout in (*src.values(), *dst.values()):
            layout.validate()  # built and checked once, as a job holds them
        by_rank, by_name = _megatron_rosters(r, src, dst, w)
        plan_refit(r, src, dst, 0)  # warm: the given layouts' rank and box indexes
        ours = theirs = 0.0
        for rank in (1, half + 1):
            best_o = best_m = math.inf
            for _ in range(reps):
                t0 = time.perf_counter()
                p = plan_refit(r, src, dst, rank)
                for job in p.jobs:  # its pieces, as Megatron's plan lists its ops
                    reshard_plan(job.src, job.dst, rank)
                t1 = time.perf_counter()
                m = build_plan_from_rosters(by_rank, by_name, rank)
                t2 = time.perf_counter()
                best_o, best_m = min(best_o, t1 - t0), min(best_m, t2 - t1)
            ours, theirs = max(ours, best_o), max(theirs, best_m)
        rows.append((w, ours, theirs, len(p.jobs), len(m.recv_ops) + len(m.send_ops)))
    return rows


# ---------------------------------------------------------------- rank side


def _full(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + sum(map(ord, name)))
    return torch.randn(shape, generator=g).to(torch.bfloat16)


def _digest(tensors: list[torch.Tensor]) -> list[str]:
    return [str(int(t.contiguous().view(torch.uint8).to(torch.int64).sum())) for t in tensors]


def transfer(rank: int, world: int, layers: int, dim: int, variant: str, repeat: int
             ) -> dict[str, Any]:  # fmt: skip
    """``repeat`` timed refits of ``variant`` on this rank after an untimed one."""
    import torch.distributed as dist

    from shardspec.refit import plan_refit, refit
    from shardspec.reshard import plan as reshard_plan

    ranks = list(range(world))
    r, src, dst = model(layers, dim, ranks, world, ranks, world // 2)
    state = {n: [_full(n, layout.shape, 1)[b.slices()].clone() for b in layout.boxes_of(rank)]
             for n, layout in src.items()}  # fmt: skip
    out = {n: [torch.zeros(b.sizes, dtype=torch.bfloat16) for b in layout.boxes_of(rank)]
           for n, layout in dst.items()}  # fmt: skip
    if variant == "ours":

        def run() -> None:
            refit(r, state, src, dst, out=out)

    elif variant == "megatron":
        from conformance.peers.megatron.refit_ops import MegatronRefit
        from conformance.peers.megatron.rosters import rosters

        mine = rosters(r, src, dst, dict.fromkeys(src, "bfloat16"), world)[rank]
        theirs = MegatronRefit(mine, state, rank, world)
        run = theirs.run

    else:  # the floor
        send, recv = [0] * world, [0] * world
        for job in plan_refit(r, src, dst, rank).jobs:
            for piece in reshard_plan(job.src, job.dst, rank, validate=False):
                if piece.src_rank != piece.dst_rank:
                    n = math.prod(piece.sizes) * 2
                    if piece.src_rank == rank:
                        send[piece.dst_rank] += n
                    if piece.dst_rank == rank:
                        recv[piece.src_rank] += n
        sendbuf = torch.zeros(sum(send), dtype=torch.uint8)
        recvbuf = torch.empty(sum(recv), dtype=torch.uint8)

        def run() -> None:
            dist.all_to_all_single(recvbuf, sendbuf, recv, send)

    run()  # untimed: plans built, buffers made
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        run()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if variant == "ours":
        digest = _digest([t for n in dst for t in out[n]])
    elif variant == "megatron":
        digest = _digest(theirs.result())
    else:
        digest = []
    return {
        "times": times,
        "digest": digest,
        "bytes": sum(t.nbytes for v in out.values() for t in v),
    }


# ---------------------------------------------------------------- driver side

_TRANSFER = "conformance.peers.megatron.bench:transfer"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="8,64,256,1024", help="planning's simulated worlds")
    ap.add_argument("--reps", type=int, default=3, help="planning: best of (default 3)")
    ap.add_argument("--repeat", type=int, default=None, help="timed refits a variant (5)")
    ap.add_argument("--layers", type=int, default=8, help="transfer: layers (default 8)")
    ap.add_argument("--dim", type=int, default=1024, help="transfer: width (default 1024)")
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    args, _ = ap.parse_known_args()  # nox -s bench passes every script the same arguments
    quick = args.quick or os.environ.get("SHARDSPEC_BENCH_QUICK") == "1"
    try:
        from importlib.metadata import version

        release = version("megatron-core")
    except Exception as e:  # not installed: the venv of nox -s peers_megatron has it
        print(f"peers/megatron/bench.py: skipped: Megatron-Core is not installed ({e})")
        return
    worlds = [8, 64] if quick else [int(w) for w in args.worlds.split(",")]
    rows = bench_planning(worlds, 1 if quick else args.reps)
    print(f"Megatron-Core {release} refit beside shardspec.refit, ratios in the same run")
    print("\nplanning one rank's refit (2 layers; half TP 2 x DP training, half TP 4 x DP "
          "serving; Megatron: build_plan_from_rosters on gathered rosters)")  # fmt: skip
    fmt = "{:>6} {:>12} {:>12} {:>10} {:>10} {:>14}"
    print(fmt.format("world", "ours", "megatron", "meg/ours", "our jobs", "megatron ops"))
    for w, o, m, jobs, ops in rows:
        print(fmt.format(w, f"{o * 1e3:.2f} ms", f"{m * 1e3:.2f} ms", f"{m / o:.2f}x", jobs, ops))
    first, last = rows[0], rows[-1]
    log = math.log(last[0]) / math.log(first[0])
    print(f"growth {first[0]} -> {last[0]} ranks: ours {last[1] / first[1]:.2f}x, Megatron "
          f"{last[2] / first[2]:.2f}x (log W grows {log:.2f}x)")  # fmt: skip

    from shardspec.testing import RankPool

    layers, dim = (2, 256) if quick else (args.layers, args.dim)
    repeat = args.repeat or (1 if quick else 5)
    variants = ("megatron", "ours", "floor")
    pool = RankPool(WORLD, timeout=1200)
    try:
        res = {v: pool.call(_TRANSFER, layers, dim, v, repeat) for v in variants}
    finally:
        pool.close()
    for rank in range(WORLD):
        if res["megatron"][rank]["digest"] != res["ours"][rank]["digest"]:
            raise SystemExit(f"rank {rank}: Megatron's refit and ours left different bits")
    s = {v: statistics.median(max(x["times"][i] for x in res[v]) for i in range(repeat))
         for v in variants}  # fmt: skip
    nbytes = sum(x["bytes"] for x in res["ours"])
    print(f"\ntransfer: {layers} layers of {dim} in bfloat16 ({nbytes / 2**20:.0f} MiB held by "
          f"the serving side in all), TP {WORLD} -> TP {WORLD // 2} x DP 2 on {WORLD} colocated "
          f"gloo ranks, plans reused; slowest rank, median of {repeat}")  # fmt: skip
    fmt = "{:<10} {:>10} {:>9}"
    print(fmt.format("variant", "seconds", "x/floor"))
    for v in variants:
        print(fmt.format(v, f"{s[v]:.3f}s", f"{s[v] / s['floor']:.2f}x"))
    print(
        f"Megatron / ours: {s['megatron'] / s['ours']:.2f}x; both left the same bits on every rank"
    )


if __name__ == "__main__":
    main()
