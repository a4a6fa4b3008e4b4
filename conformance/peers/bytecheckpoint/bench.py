"""ByteCheckpoint's own load of an FSDP2 model and its Adam state against
``shardspec.checkpoint.load`` of the same checkpoint (ByteCheckpoint writes DCP's format with
metadata classes of its own, which our load reads: CKPT-21), ``dcp.load`` with our planner and
reader, and the read floor, measured in the same run (spec/09-checkpoint.md, "Measured").

ByteCheckpoint claims loads up to 8.8x faster than DCP; this is its load on the machine and
model of our own figures. The model: ``--layers`` Linear(D, D) layers (default 16 of 2048 x
2048 float32: 256 MiB of parameters, 768 MiB with Adam's two moments), each and the whole
``fully_shard``-ed over 4 gloo ranks, one Adam step, saved with ``bytecheckpoint.save``
(``framework="fsdp2"``: ``model/`` and ``optimizer/``). Each load goes into a fresh model and
optimizer of other values, built before the clock:

* ``bytecheckpoint``: ``bytecheckpoint.load(path, {"model", "optimizer"}, framework="fsdp2")``;
* ``load-own`` / ``load-once``: ``get_model_state_dict`` / ``get_optimizer_state_dict``, one
  ``shardspec.checkpoint.load`` per directory, ``set_optimizer_state_dict``, as a user of
  ``dcp.load`` writes it;
* ``dcp-ours``: the same with ``dcp.load`` and our ``LoadPlanner`` + ``FileSystemReader``;
* ``floor``: no load: every file of both directories read once between the ranks.

The slowest rank's wall time from a barrier to a barrier, median of ``--repeat`` runs after an
untimed one, the order rotating. Before anything is reported every rank checks that every
loader left the same bits in every parameter and Adam state, and that they are the saved ones.

Needs ByteCheckpoint 0.0.2 (the venv of ``nox -s peers_bytecheckpoint``); elsewhere it says so
and exits 0. Run alone (under the timing lock)::

    flock /tmp/shardspec-timing.lock .nox/torch-2.13.0-bytecheckpoint-0.0.2/bin/python \\
        conformance/peers/bytecheckpoint/bench.py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from shardspec.testing import RankPool

WORLD = 4
LOADERS = ("bytecheckpoint", "load-own", "load-once", "dcp-ours")
VARIANTS = (*LOADERS, "floor")
_SUBDIRS = ("model", "optimizer")


# ---------------------------------------------------------------- rank side


def _model(world: int, layers: int, dim: int, seed: int) -> tuple[Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(2, dim, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def _digest(model: Any, opt: Any) -> str:
    """Every local parameter and Adam state of this rank, bit for bit."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.to_local().detach().contiguous().view(torch.uint8).numpy().tobytes())
        for what, v in sorted(opt.state[p].items()):
            local = v.to_local() if hasattr(v, "to_local") else v
            h.update(what.encode())
            h.update(local.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save(rank: int, world: int, path: str, layers: int, dim: int) -> str:
    from conformance.peers.bytecheckpoint.ops import _bcp

    model, opt = _model(world, layers, dim, seed=0)
    _bcp().save(path, {"model": model, "optimizer": opt}, framework="fsdp2")
    return _digest(model, opt)


def _floor_buffers(path: str, rank: int, world: int) -> list[tuple[str, Any]]:
    files = sorted(
        os.path.join(path, d, f)
        for d in _SUBDIRS
        for f in os.listdir(os.path.join(path, d))
        if f.endswith(".distcp")
    )
    return [
        (f, torch.empty(os.path.getsize(f), dtype=torch.uint8).fill_(1).numpy())
        for f in files[rank::world]
    ]


def load(rank: int, world: int, path: str, variant: str, layers: int, dim: int) -> dict[str, Any]:
    """One load (or the floor) of ``variant`` on this rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from shardspec.checkpoint import load as collective_load
    from shardspec.checkpoint.dcp import FileSystemReader, LoadPlanner

    model = opt = None
    buffers: list[tuple[str, Any]] = []
    if variant == "floor":
        buffers = _floor_buffers(path, rank, world)
    else:
        model, opt = _model(world, layers, dim, seed=5)
    if variant == "bytecheckpoint":
        from conformance.peers.bytecheckpoint.ops import _bcp

        bcp = _bcp()
    nread = -1
    dist.barrier()
    t0 = time.perf_counter()
    if variant == "bytecheckpoint":
        bcp.load(path, {"model": model, "optimizer": opt}, framework="fsdp2")
    elif variant == "floor":
        for f, buf in buffers:
            with open(f, "rb", buffering=0) as fh:
                fh.readinto(buf)
        nread = sum(b.nbytes for _, b in buffers)
    else:
        msd = get_model_state_dict(model)
        osd = get_optimizer_state_dict(model, opt)
        state = {"state": osd["state"]}  # the param groups are the job's, not the checkpoint's
        if variant == "dcp-ours":
            for sd, sub in ((msd, "model"), (state, "optimizer")):
                dcp.load(
                    sd, storage_reader=FileSystemReader(f"{path}/{sub}"), planner=LoadPlanner()
                )
        else:
            nread = 0
            for sd, sub in ((msd, "model"), (state, "optimizer")):
                nread += collective_load(sd, f"{path}/{sub}", reads=variant[5:]).bytes_read
        set_optimizer_state_dict(model, opt, {**osd, "state": state["state"]})
    dist.barrier()
    seconds = time.perf_counter() - t0
    # Untimed: a rank that left the barrier first would otherwise start hashing its tensors
    # and take the cores from the ranks still leaving it, whose clocks are still running.
    dist.barrier()
    return {
        "seconds": seconds,
        "bytes": nread,
        "digest": _digest(model, opt) if model is not None else "",
    }


# ---------------------------------------------------------------- driver side

# the ranks import this module by its name in the suite, also when it runs as a script
_MODULE = "conformance.peers.bytecheckpoint.bench"
_LOAD, _SAVE = f"{_MODULE}:load", f"{_MODULE}:save"


def _mib(n: int) -> str:
    return "n/a" if n < 0 else f"{n / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=None, help="timed loads a variant (3; quick 1)")
    ap.add_argument("--layers", type=int, default=16, help="Linear layers (default 16)")
    ap.add_argument("--dim", type=int, default=2048, help="their width (default 2048)")
    ap.add_argument("--quick", action="store_true", help="4 layers of 256: a smoke run")
    args, _ = ap.parse_known_args()  # nox -s bench passes every script the same arguments
    quick = args.quick or os.environ.get("SHARDSPEC_BENCH_QUICK") == "1"
    layers, dim = (4, 256) if quick else (args.layers, args.dim)
    repeat = args.repeat or (1 if quick else 3)
    try:
        from conformance.peers.bytecheckpoint.env import version

        release = version()
    except Exception as e:  # not installed: the venv of nox -s peers_bytecheckpoint has it
        print(f"peers/bytecheckpoint/bench.py: skipped: ByteCheckpoint is not installed ({e})")
        return
    with tempfile.TemporaryDirectory() as tmp:
        pool = RankPool(WORLD, timeout=1200)
        try:
            saved = pool.call(_SAVE, tmp, layers, dim)
            first = {v: pool.call(_LOAD, tmp, v, layers, dim) for v in VARIANTS}  # untimed
            runs: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in VARIANTS}
            for i in range(repeat):
                k = i % len(VARIANTS)
                for v in VARIANTS[k:] + VARIANTS[:k]:
                    runs[v].append(pool.call(_LOAD, tmp, v, layers, dim))
            nbytes = sum(
                os.path.getsize(os.path.join(tmp, d, f))
                for d in _SUBDIRS
                for f in os.listdir(os.path.join(tmp, d))
            )
        finally:
            pool.close()
    for r in range(WORLD):
        for v in LOADERS:
            for res in [first[v], *runs[v]]:
                if res[r]["digest"] != saved[r]:
                    raise SystemExit(f"{v}, rank {r}: the model and optimizer are not the saved")
    s = {v: statistics.median(max(x["seconds"] for x in res) for res in runs[v]) for v in VARIANTS}
    print(f"ByteCheckpoint {release}: load of an FSDP2 model + Adam ({layers} x Linear({dim}, "
          f"{dim}), {nbytes / 2**20:.0f} MiB of files) on {WORLD} gloo ranks; slowest rank, "
          "median; ratios in the same run")  # fmt: skip
    fmt = "{:<15} {:>9} {:>17} {:>11} {:>12}"
    print(fmt.format("variant", "seconds", "bytecheckpoint/x", "x/floor", "job bytes"))
    for v in VARIANTS:
        job = sum(x["bytes"] for x in runs[v][-1])
        print(
            fmt.format(
                v,
                f"{s[v]:.3f}s",
                f"{s['bytecheckpoint'] / s[v]:.2f}x",
                f"{s[v] / s['floor']:.2f}x",
                _mib(job if job >= 0 else -1),
            )
        )
    print("every loader left the saved bits in every parameter and Adam state, on every rank")


if __name__ == "__main__":
    main()
