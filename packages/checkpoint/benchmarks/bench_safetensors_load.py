"""``shardspec.checkpoint.load`` of a Hugging Face safetensors checkpoint as tensor-parallel
DTensor shards, against ``dcp.load`` with torch's ``HuggingFaceStorageReader`` (the baseline
of CKPT-22) and the read floor, measured in the same run (spec/09-checkpoint.md).

The checkpoint: 16 bfloat16 weights of 8192 x 4096 (64 MiB each, 1 GiB; ``--quick``: 512 x
256), in two ``model-0000k-of-00002.safetensors`` files with their index JSON, as
``transformers`` writes them. Loaded on 4 gloo ranks as DTensors on a 4-mesh, tensor-parallel
as a transformer block's are: even weights ``Shard(0)`` (column-parallel), odd ones
``Shard(1)`` (row-parallel: each rank wants a column slab of every row).

Variants: ``load-own`` / ``load-once`` (:func:`shardspec.checkpoint.load`), ``hf``
(``dcp.load`` with ``HuggingFaceStorageReader`` and DCP's default planner) and ``floor`` (no
load: every ``.safetensors`` file read once between the ranks, into buffers allocated and
touched before the clock). Per variant: the slowest rank's wall time from a barrier to a
barrier (median of ``--repeat`` runs after an untimed one; the order rotates), storage bytes
read (per rank: the most one rank read; per job: the sum; ``LoadStats.bytes_read``; the HF
reader counts nothing: n/a) and the peak RSS above the start. Before anything is reported,
every rank checks that every loader loaded the same bytes, and rank 0 that they are the
slices of what ``safetensors.torch.load_file`` gives.

Run alone (under the timing lock) and read the ratios::

    flock /tmp/shardspec-timing.lock python packages/checkpoint/benchmarks/bench_safetensors_load.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_dcp_load import _floor_buffers, _read_floor, _RssPeak

from shardspec.testing import RankPool

QUICK_SHAPE, SHAPE = (512, 256), (8192, 4096)
N_WEIGHTS, FILES, WORLD = 16, 2, 4
LOADERS = ("load-own", "load-once", "hf")
VARIANTS = (*LOADERS, "floor")


def _shape(quick: bool) -> tuple[int, int]:
    return QUICK_SHAPE if quick else SHAPE


def _name(i: int) -> str:
    return f"model.layers.{i // 2}.{'up' if i % 2 == 0 else 'down'}_proj.weight"


def _full(i: int, shape: tuple[int, int]) -> torch.Tensor:
    """Weight ``i``: distinct bits in every element, cheap to make."""
    n = shape[0] * shape[1]
    bits = torch.arange(n, dtype=torch.int32).mul_(2654435761).add_(i * 97)
    return bits.to(torch.int16).view(torch.bfloat16).reshape(shape)


# ---------------------------------------------------------------- rank side


def save(rank: int, world: int, path: str, quick: bool) -> None:
    """Rank 0 writes the checkpoint as ``transformers`` does: two files and the index."""
    if rank:
        return
    from safetensors.torch import save_file

    shape = _shape(quick)
    per = N_WEIGHTS // FILES
    weight_map, total = {}, 0
    for f in range(FILES):
        name = f"model-{f + 1:05d}-of-{FILES:05d}.safetensors"
        part = {_name(i): _full(i, shape) for i in range(f * per, (f + 1) * per)}
        save_file(part, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    Path(path, "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _state(world: int, quick: bool) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = init_device_mesh("cpu", (world,))
    shape = _shape(quick)
    out = {}
    for i in range(N_WEIGHTS):
        placements = [Shard(i % 2)]
        local, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
        t = torch.zeros(local, dtype=torch.bfloat16)
        out[_name(i)] = DTensor.from_local(
            t, mesh, placements, run_check=False, shape=torch.Size(shape), stride=(shape[1], 1)
        )
    return out


def _digest(sd: dict[str, Any]) -> str:
    import hashlib

    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(sd[k].to_local().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def load(rank: int, world: int, path: str, variant: str, quick: bool) -> dict[str, Any]:
    """One load (or the floor) of ``variant`` on this rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    from shardspec.checkpoint import load as collective_load

    sd = _state(world, quick) if variant != "floor" else {}
    buffers = _floor_buffers(path, rank, world, ".safetensors") if variant == "floor" else []
    out: dict[str, Any] = {"bytes": -1, "reads": ""}
    dist.barrier()
    with _RssPeak() as rss:
        t0 = time.perf_counter()
        if variant.startswith("load-"):
            stats = collective_load(sd, path, reads=variant[len("load-") :])
            out.update(bytes=stats.bytes_read, reads=stats.reads)
        elif variant == "hf":
            dcp.load(sd, storage_reader=HuggingFaceStorageReader(path))
        else:
            _read_floor(buffers)
            out["bytes"] = sum(b.nbytes for _, _, b in buffers)
        dist.barrier()
        out["seconds"] = time.perf_counter() - t0
        # Untimed: a rank that left the barrier first would otherwise start hashing its tensors
        # and take the cores from the ranks still leaving it, whose clocks are still running.
        dist.barrier()
    out["rss"] = rss.above
    out["digest"] = _digest(sd) if sd else ""
    if sd and rank == 0 and variant == "load-own":
        out["matches_load_file"] = _matches_load_file(sd, path)
    return out


def _matches_load_file(sd: dict[str, Any], path: str) -> bool:
    """Whether rank 0's local tensors are the slices of ``safetensors.torch.load_file``'s."""
    from safetensors.torch import load_file
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    whole: dict[str, torch.Tensor] = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            whole.update(load_file(os.path.join(path, f)))
    for k, v in sd.items():
        sizes, offsets = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
        want = whole[k][tuple(slice(o, o + n) for o, n in zip(offsets, sizes))]
        got = v.to_local()
        if not torch.equal(got.view(torch.int16), want.contiguous().view(torch.int16)):
            return False
    return True


# ---------------------------------------------------------------- driver side

_LOAD, _SAVE = f"{Path(__file__).stem}:load", f"{Path(__file__).stem}:save"


def measure(pool: RankPool, path: str, repeat: int, quick: bool) -> dict[str, Any]:
    runs: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in VARIANTS}
    first = {v: pool.call(_LOAD, path, v, quick) for v in VARIANTS}  # untimed
    if not first["load-own"][0]["matches_load_file"]:
        raise SystemExit("load-own did not load the slices of safetensors.torch.load_file")
    for i in range(repeat):
        k = i % len(VARIANTS)
        for v in VARIANTS[k:] + VARIANTS[:k]:
            runs[v].append(pool.call(_LOAD, path, v, quick))
    for r in range(pool.world_size):
        seen = {res[r]["digest"] for v in LOADERS for res in [first[v], *runs[v]]}
        if len(seen) != 1:
            raise SystemExit(f"rank {r}: the loaders loaded different bytes")
    out: dict[str, Any] = {"auto": pool.call(_LOAD, path, "load-auto", quick)[0]["reads"]}
    for v in VARIANTS:
        last = runs[v][-1]
        out[v] = {
            "seconds": statistics.median(max(x["seconds"] for x in res) for res in runs[v]),
            "rss": max(x["rss"] for res in runs[v] for x in res),
            "rank_bytes": max(x["bytes"] for x in last),
            "job_bytes": sum(x["bytes"] for x in last) if last[0]["bytes"] >= 0 else -1,
        }
    return out


def _mib(n: int) -> str:
    return "n/a" if n < 0 else f"{n / 2**20:.1f} MiB"


def report(r: dict[str, Any], nbytes: int) -> None:
    s = {v: r[v]["seconds"] for v in VARIANTS}
    print(f"a safetensors checkpoint ({nbytes / 2**20:g} MiB in {FILES} files) loaded as TP")
    print(f"DTensor shards on {WORLD} gloo ranks; slowest rank, median; ratios in the same run")
    fmt = "{:<10} {:>9} {:>10} {:>10} {:>12} {:>12} {:>12}"
    print(fmt.format("variant", "seconds", "hf/this", "this/floor", "rank bytes", "job bytes",
                     "peak RSS"))  # fmt: skip
    for v in VARIANTS:
        print(
            fmt.format(
                v,
                f"{s[v]:.3f}s",
                f"{s['hf'] / s[v]:.2f}x",
                f"{s[v] / s['floor']:.2f}x",
                _mib(r[v]["rank_bytes"]),
                _mib(r[v]["job_bytes"]),
                _mib(r[v]["rss"]),
            )
        )
    print(f"reads='auto' picks {r['auto']!r}; every loader loaded the same bytes on every rank,")
    print("and load-own's are the slices of safetensors.torch.load_file's (rank 0)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=None, help="timed loads a variant (3; quick 1)")
    ap.add_argument("--quick", action="store_true", help="512 x 256 weights: a smoke run")
    args, _ = ap.parse_known_args()  # nox -s bench passes every script the same arguments
    quick = args.quick or os.environ.get("SHARDSPEC_BENCH_QUICK") == "1"
    repeat = args.repeat or (1 if quick else 3)
    try:
        from torch.distributed.checkpoint import HuggingFaceStorageReader  # noqa: F401
    except ImportError as e:
        print(f"bench_safetensors_load: skipped: {e}", file=sys.stderr)
        return
    shape = _shape(quick)
    nbytes = N_WEIGHTS * shape[0] * shape[1] * 2
    with tempfile.TemporaryDirectory() as tmp:
        pool = RankPool(WORLD, timeout=1200)
        try:
            pool.call(_SAVE, tmp, quick)
            r = measure(pool, tmp, repeat, quick)
        finally:
            pool.close()
    report(r, nbytes)


if __name__ == "__main__":
    main()
