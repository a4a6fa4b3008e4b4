"""Rank-side functions for the in-place (direct) exchange tests: run a reshard and report how
often this process used a tensor itself as the collective's receive or send buffer.

The in-place buffers are the ``all_to_all_single`` transport's (NCCL's and the simulated
worlds'); these functions force it, since gloo ranks would otherwise send messages
(``transport="messages"`` runs them so, for the message tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from shardspec.metadata import Layout
from shardspec.reshard import buffers, executor, messages, reshard, reshard_state_dict

T = TypeVar("T")


@contextmanager
def transport(name: str) -> Iterator[None]:
    old, messages.TRANSPORT = messages.TRANSPORT, name
    try:
        yield
    finally:
        messages.TRANSPORT = old


def _via(name: str, fn: Callable[[], T]) -> T:
    with transport(name):
        return fn()


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
    kwargs = dict(kwargs)
    how = kwargs.pop("transport", "all_to_all")
    before = dict(executor.DIRECT_COUNTS)
    res = _via(how, lambda: reshard(inputs, src, dst, **kwargs))
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
    kwargs = dict(kwargs)
    how = kwargs.pop("transport", "all_to_all")
    before = dict(executor.DIRECT_COUNTS)
    res = _via(how, lambda: reshard_state_dict(state, src, dst, **kwargs))
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


def run_kept(
    rank: int,
    world: int,
    calls: list[tuple[dict[str, list[torch.Tensor]], dict[str, Layout], dict[str, Layout]]],
    budget: int | None,
) -> list[tuple[dict[str, list[torch.Tensor]], int]]:
    """Each state dict resharded in turn with ``budget`` over messages: its outputs and how
    many wire buffers the executor kept after it; the kept buffers are released at the end."""
    out = []
    buffers.release_buffers()
    with transport("messages"):
        for state, src, dst in calls:
            res = reshard_state_dict(state, src, dst, max_buffer_bytes=budget)
            out.append((res, sum(len(v) for v in buffers._KEPT.values())))
    buffers.release_buffers()
    out.append(({}, sum(len(v) for v in buffers._KEPT.values())))
    return out
