"""Rank-side scenarios of the faults area (run by :func:`conformance.faults.world.run_world`).

Each returns a JSON-able verdict. Times are measured on the rank, from just before its call
to the moment it got its answer or error.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from shardspec.metadata import chunk_layout
from shardspec.reshard import buffers, release_buffers, reshard, reshard_state_dict
from shardspec.testing.memory import reset_peak_rss, rss

SHAPE = (8, 6)


def _rows_to_rows(world: int) -> tuple[Any, Any]:
    # One (rows, 6) box per rank before and after, in another rank order: an out tensor
    # can be the twin of an input.
    src = chunk_layout(SHAPE, 0, list(range(world)))
    dst = chunk_layout(SHAPE, 0, [(r + 1) % world for r in range(world)])
    return src, dst


def _spoil(how: str, ins: list[torch.Tensor], kwargs: dict[str, Any]) -> Any:
    """One rank's bad argument, named by ``how``; returns the inputs to pass."""
    if how == "device 'bogus'":
        kwargs["device"] = "bogus"
    elif how == "device 'cuda' without CUDA":
        kwargs["device"] = "cuda" if not torch.cuda.is_available() else "cuda:99"
    elif how == "a sparse shard":
        ins[0] = ins[0].to_sparse()
    elif how == "a meta shard":
        ins[0] = torch.empty_like(ins[0], device="meta")
    elif how == "out aliasing the input":
        kwargs["out"] = [ins[0]]
    elif how == "a wrong shape":
        ins[0] = ins[0][:1]
    elif how == "a wrong dtype":
        ins[0] = ins[0].double()
    else:
        raise AssertionError(how)
    return ins


def bad_input_while_alive(rank: int, world: int, bad_rank: int, hows: list[str]) -> dict[str, Any]:
    """For each ``how``: ``bad_rank`` passes that bad argument and stays alive; every rank
    records what it raised and how long it took. Then one good call on every rank shows the
    group is still usable."""
    src, dst = _rows_to_rows(world)
    full = torch.arange(48, dtype=torch.float32).reshape(SHAPE)
    seen = []
    for how in hows:
        ins: Any = [full[b.slices()].clone() for b in src.boxes_of(rank)]
        kwargs: dict[str, Any] = {}
        if rank == bad_rank:
            ins = _spoil(how, ins, kwargs)
        start = time.monotonic()
        try:
            reshard(ins, src, dst, **kwargs)
            seen.append({"how": how, "error": None, "seconds": time.monotonic() - start})
        except Exception as e:
            seen.append(
                {
                    "how": how,
                    "error": type(e).__name__,
                    "message": str(e),
                    "seconds": time.monotonic() - start,
                }
            )
    good = reshard([full[b.slices()].clone() for b in src.boxes_of(rank)], src, dst)
    want = [full[b.slices()] for b in dst.boxes_of(rank)]
    return {"seen": seen, "after": all(torch.equal(a, b) for a, b in zip(good, want))}


def killed_mid_reshard(rank: int, world: int, victim: int, rounds: int) -> dict[str, Any]:
    """A reshard of many rounds; ``victim`` is killed (SIGKILL) in the middle of it, after
    its third collective. The survivors record what they raised and when."""
    shape = (64, 64)
    src = chunk_layout(shape, 0, list(range(world)))
    dst = chunk_layout(shape, 1, list(range(world)))
    full = torch.arange(64 * 64, dtype=torch.float32).reshape(shape)
    ins = [full[b.slices()].clone() for b in src.boxes_of(rank)]
    budget = max(16 * (world + 1), 64 * 64 * 4 // world // rounds)
    if rank == victim:
        # A round is one all_to_all_single, or one batch of messages or two on gloo
        # (shardspec.reshard.executor's transports): the victim dies at its third of either.
        real, real_batch = dist.all_to_all_single, dist.batch_isend_irecv
        calls = [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 3:
                os.kill(os.getpid(), 9)
            return real(*args, **kwargs)

        def dying_batch(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 3:
                os.kill(os.getpid(), 9)
            return real_batch(*args, **kwargs)

        dist.all_to_all_single = dying  # type: ignore[assignment]
        dist.batch_isend_irecv = dying_batch  # type: ignore[assignment]
    start = time.monotonic()
    try:
        reshard(ins, src, dst, max_buffer_bytes=budget)
    except Exception as e:
        return {
            "error": type(e).__name__,
            "message": str(e)[:500],
            "seconds": time.monotonic() - start,
            "skip_teardown": True,
        }
    return {"error": None, "seconds": time.monotonic() - start, "skip_teardown": True}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def many_small_reshards(rank: int, world: int, calls: int, warmup: int) -> dict[str, Any]:
    """``calls`` consecutive small reshards (rows to columns, a state dict of two tensors);
    resident memory and open file descriptors after ``warmup`` calls and at the end."""
    shape = (8, 8)
    src = {"w": chunk_layout(shape, 0, list(range(world))), "b": chunk_layout((8,), 0, [0])}
    dst = {"w": chunk_layout(shape, 1, list(range(world))), "b": chunk_layout((8,), 0, [world - 1])}
    # Every rank must draw the same tensor: the ranks' default generators are not in step.
    full = {
        "w": torch.randn(shape, generator=torch.Generator().manual_seed(0)),
        "b": torch.arange(8),
    }
    state = {k: [full[k][b.slices()].clone() for b in src[k].boxes_of(rank)] for k in src}
    want = {k: [full[k][b.slices()] for b in dst[k].boxes_of(rank)] for k in dst}

    def one() -> bool:
        got = reshard_state_dict(state, src, dst)
        return all(torch.equal(a, b) for k in want for a, b in zip(got[k], want[k]))

    ok = all(one() for _ in range(warmup))
    gc.collect()
    rss0, fds0 = rss(), _fds()
    for _ in range(calls - warmup):
        ok = one() and ok
    gc.collect()
    return {"ok": ok, "rss": [rss0, rss()], "fds": [fds0, _fds()]}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _pattern(box: Any, dtype: torch.dtype) -> torch.Tensor:
    """The values of a box of a (rows, cols) tensor: (7 * row + col) % 251, from global
    coordinates, so that any rank can say what any box must hold."""
    r0, c0 = box.offsets
    rows, cols = box.sizes
    r = torch.arange(r0, r0 + rows, dtype=torch.int32)[:, None] * 7
    return ((r + torch.arange(c0, c0 + cols, dtype=torch.int32)[None, :]) % 251).to(dtype)


def big_state_dict(rank: int, world: int, total_bytes: int, budget: int) -> dict[str, Any]:
    """A state dict of ``total_bytes`` in all (mixed dtypes, rows to columns in another rank
    order) resharded with ``max_buffer_bytes=budget``: the peak resident memory the call
    added on this rank, the bytes of this rank's outputs, and whether they are right."""
    dtypes = [torch.float32, torch.bfloat16, torch.float64, torch.int8]
    src, dst, state = {}, {}, {}
    for i, dt in enumerate(dtypes):
        cols = 1024
        rows = max(world, total_bytes // len(dtypes) // dt.itemsize // cols)
        key = f"t{i}"
        src[key] = chunk_layout((rows, cols), 0, list(range(world)))
        dst[key] = chunk_layout((rows, cols), 1, [(r + 1) % world for r in range(world)])
        state[key] = [_pattern(b, dt) for b in src[key].boxes_of(rank)]
    out_bytes = sum(
        b.numel * dtypes[i].itemsize for i, k in enumerate(dst) for b in dst[k].boxes_of(rank)
    )
    gc.collect()
    dist.barrier()
    if not reset_peak_rss():
        return {"skip": "this kernel does not let a process reset its peak RSS"}
    base = _status_kib("VmRSS") * 1024
    release_buffers()  # none kept from an earlier call: this one makes its own
    got = reshard_state_dict(state, src, dst, max_buffer_bytes=budget)
    peak = _status_kib("VmHWM") * 1024

    def right(got: dict[str, list[torch.Tensor]]) -> bool:
        return all(
            torch.equal(t, _pattern(b, dtypes[i]))
            for i, k in enumerate(dst)
            for t, b in zip(got[k], dst[k].boxes_of(rank))
        )

    ok = right(got)
    # A second call reuses the buffers the first kept (RESHARD-6): it adds its outputs only.
    del got
    gc.collect()
    dist.barrier()
    reset_peak_rss()
    base2 = _status_kib("VmRSS") * 1024
    again = reshard_state_dict(state, src, dst, max_buffer_bytes=budget)
    peak2 = _status_kib("VmHWM") * 1024
    ok = ok and right(again)
    kept = sum(len(v) for v in buffers._KEPT.values())
    release_buffers()
    return {
        "growth": peak - base,
        "growth_again": peak2 - base2,
        "kept": kept,
        "kept_after_release": sum(len(v) for v in buffers._KEPT.values()),
        "out_bytes": out_bytes,
        "budget": budget,
        "ok": ok,
    }
