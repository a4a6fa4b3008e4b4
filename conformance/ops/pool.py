"""The conformance suite's pool operations (``pool.*``): what the suite's own tests of the
pool and the pool benchmark run. Every area registers its operations in
``shardspec.testing.ops``'s table from its own module (``conformance.ops.<area>``); pools of the
suite import the modules :data:`conformance.OPS` lists on every rank. What the areas share lives
in :mod:`conformance.ops.shared`.

An operation gets the rank's :class:`Context`, the JSON arguments (the same on every rank) and
its input tensors, and returns a JSON value and output tensors. A *collective* operation
splits into ``check`` (local validation, no communication) and ``run``; every rank runs its
check, then all ranks agree on the outcome with one all-reduce, and only if every check
passed does any rank enter ``run``. So a bad input never strands a rank inside a collective.

Adding an operation: decorate a function with ``@operation("area.name", collective=...,
check=...)`` in an area module listed in :data:`conformance.OPS`. Names are what travels;
nothing else about the function does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from conformance.ops.shared import on_listed_rank
from shardspec.testing.ops import OPERATIONS, Context, Outcome, execute, operation, warm_up

__all__ = ["OPERATIONS", "Context", "Outcome", "execute", "operation", "warm_up"]


# -- operations used by the suite's own tests and the benchmark ---------------------------
@operation("pool.echo", collective=False)
def _echo(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    return {"rank": ctx.rank, "world": ctx.world, "args": args}, ts


def _fail_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if args.get("phase") == "check" and on_listed_rank(ctx, args):
        raise ValueError(args.get("message", "deliberate failure"))


@operation("pool.fail", collective=True, check=_fail_check)
def _fail(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    if args.get("phase") == "run" and on_listed_rank(ctx, args):
        raise ValueError(args.get("message", "deliberate failure"))
    dist.barrier()
    return None, []


@operation("pool.strand", collective=False)
def _strand(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """Declared non-collective, as a peer's operation may be: the listed ranks raise, the
    others wait in a barrier they never leave."""
    if on_listed_rank(ctx, args):
        raise ValueError(args.get("message", "deliberate failure"))
    dist.barrier()
    return None, []


@operation("pool.exit", collective=False)
def _exit(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    if on_listed_rank(ctx, args):
        os._exit(int(args.get("code", 7)))
    return None, []


@operation("pool.hang", collective=False)
def _hang(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    if on_listed_rank(ctx, args):
        while True:
            time.sleep(3600)
    return None, []


def _a2a_check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    splits = args["splits"]
    if len(splits) != ctx.world or any(len(row) != ctx.world for row in splits):
        raise ValueError(f"splits must be {ctx.world}x{ctx.world}, got {splits}")
    if len(ts) != 1 or ts[0].ndim != 1 or ts[0].numel() != sum(splits[ctx.rank]):
        raise ValueError(f"rank {ctx.rank} needs one 1-d input of {sum(splits[ctx.rank])} elements")


@operation("pool.all_to_all", collective=True, check=_a2a_check)
def _all_to_all(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``splits[i][j]`` elements go from rank i to rank j, as one flat byte buffer."""
    splits = args["splits"]
    (src,) = ts
    item = src.element_size()
    send = [n * item for n in splits[ctx.rank]]
    recv = [splits[j][ctx.rank] * item for j in range(ctx.world)]
    out = torch.empty(sum(recv), dtype=torch.uint8, device=src.device)
    src_bytes = (
        src.contiguous().view(torch.uint8) if src.numel() else src.new_empty(0, dtype=torch.uint8)
    )
    dist.all_to_all_single(out, src_bytes, recv, send)
    return None, [out.view(src.dtype) if out.numel() else out.new_empty(0, dtype=src.dtype)]
