"""Rank-side functions for the in-place (direct) exchange tests: run a reshard and report how
often this process used a tensor itself as the collective's receive or send buffer."""

from __future__ import annotations

from typing import Any

import torch

from shardspec.metadata import Layout
from shardspec.reshard import executor, reshard, reshard_state_dict


def run_counted(
    rank: int,
    world: int,
    inputs: list[torch.Tensor],
    src: Layout,
    dst: Layout,
    kwargs: dict[str, Any],
) -> tuple[list[torch.Tensor], dict[str, int], bool]:
    """The outputs, the direct-path counters this call added, and whether the returned
    tensors are the ``out`` tensors themselves (when ``out`` was given)."""
    before = dict(executor.DIRECT_COUNTS)
    res = reshard(inputs, src, dst, **kwargs)
    delta = {k: executor.DIRECT_COUNTS[k] - before[k] for k in before}
    given = kwargs.get("out")
    same = given is not None and all(a is b for a, b in zip(res, given))
    return res, delta, same


def run_state_dict_out(
    rank: int,
    world: int,
    state: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    out: dict[str, list[torch.Tensor]],
) -> tuple[dict[str, list[torch.Tensor]], bool]:
    """reshard_state_dict into ``out``; also whether it returned the out tensors themselves."""
    res = reshard_state_dict(state, src, dst, out=out)
    same = all(a is b for k in out for a, b in zip(res[k], out[k]))
    return res, same and set(res) == set(out)


def run_state_dict_counted(
    rank: int,
    world: int,
    state: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    kwargs: dict[str, Any],
) -> tuple[dict[str, list[torch.Tensor]], dict[str, int]]:
    """reshard_state_dict's result and the direct-path counters this call added."""
    before = dict(executor.DIRECT_COUNTS)
    res = reshard_state_dict(state, src, dst, **kwargs)
    return res, {k: executor.DIRECT_COUNTS[k] - before[k] for k in before}


def run_plans_cached(
    rank: int, world: int, calls: list[tuple[list[torch.Tensor], Layout, Layout]]
) -> list[tuple[list[torch.Tensor], bool]]:
    """Each (inputs, src, dst) resharded in turn: its outputs, and whether this rank's plan
    was in the process's plan cache before the call."""
    out = []
    for inputs, src, dst in calls:
        cached = (src.fingerprint(), dst.fingerprint(), rank) in executor._PLANS
        out.append((reshard(inputs, src, dst), cached))
    return out
