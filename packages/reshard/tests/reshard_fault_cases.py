"""Rank-side functions for the executor's per-rank checks: each rank builds its own tensors
(memory sharing and exotic tensor kinds do not survive the trip through a pipe), one rank
spoils its arguments in a named way, and every rank runs the same reshard."""

from __future__ import annotations

from typing import Any

import torch

from shardspec.metadata import Layout
from shardspec.reshard import executor, reshard, reshard_state_dict


def _mine(layout: Layout, rank: int, full: torch.Tensor) -> list[torch.Tensor]:
    return [full[b.slices()].clone() for b in layout.boxes_of(rank)]


def _outs(layout: Layout, rank: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.full(b.sizes, 7, dtype=dtype) for b in layout.boxes_of(rank)]


def _interleaved(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t``'s values in the even columns of a fresh buffer, and the odd columns: two views
    of one storage whose byte ranges cross but that share no element."""
    rows, cols = t.shape
    base = torch.zeros(rows, 2 * cols, dtype=t.dtype)
    base[:, 0::2] = t
    return base[:, 0::2], base[:, 1::2]


def run_aliased(
    rank: int, world: int, src: Layout, dst: Layout, full: torch.Tensor, bad_rank: int, how: str
) -> list[torch.Tensor]:
    """Reshard with ``out=``; on ``bad_rank`` the out tensor shares memory with an input as
    ``how`` says (src and dst give every rank boxes of one shape)."""
    ins = _mine(src, rank, full)
    outs = _outs(dst, rank, full.dtype)
    if rank == bad_rank:
        if how == "the input itself":
            outs[0] = ins[0]
        elif how == "a slice of the input's storage":
            rows = ins[0].shape[0]
            base = torch.empty(rows + 1, *ins[0].shape[1:], dtype=full.dtype)
            base[:rows] = ins[0]
            ins[0], outs[0] = base[:rows], base[1:]
        elif how == "a transposed view of the input":
            flat = ins[0].reshape(-1).clone()
            r, c = ins[0].shape
            ins[0] = flat.view(r, c)
            outs[0] = flat.view(c, r).t()
        elif how == "an expanded tensor":
            outs[0] = torch.zeros(1, *outs[0].shape[1:], dtype=full.dtype).expand_as(outs[0])
        elif how == "interleaved, sharing no element":
            ins[0], outs[0] = _interleaved(ins[0])
        else:
            raise AssertionError(how)
    return reshard(ins, src, dst, out=outs)


def run_outputs_aliased(
    rank: int, world: int, src: Layout, dst: Layout, full: torch.Tensor, bad_rank: int
) -> dict[str, list[torch.Tensor]]:
    """Two tensors resharded together; on ``bad_rank`` the second one's out is the first's."""
    state = {"a": _mine(src, rank, full), "b": _mine(src, rank, full + 1)}
    outs = {"a": _outs(dst, rank, full.dtype), "b": _outs(dst, rank, full.dtype)}
    if rank == bad_rank:
        outs["b"] = [outs["a"][0][:]]
    return reshard_state_dict(state, {"a": src, "b": src}, {"a": dst, "b": dst}, out=outs)


def run_spoiled(
    rank: int,
    world: int,
    src: Layout,
    dst: Layout,
    full: torch.Tensor,
    bad_rank: int,
    how: str,
) -> list[torch.Tensor]:
    """A plain reshard in which ``bad_rank`` spoils one argument as ``how`` says."""
    ins: Any = _mine(src, rank, full)
    kwargs: dict[str, Any] = {}
    if rank == bad_rank:
        if how == "device 'bogus'":
            kwargs["device"] = "bogus"
        elif how == "device 'cuda'":
            kwargs["device"] = "cuda"
        elif how == "device 'meta'":
            kwargs["device"] = "meta"
        elif how == "a sparse shard":
            ins[0] = ins[0].to_sparse()
        elif how == "a meta shard":
            ins[0] = torch.empty_like(ins[0], device="meta")
        elif how == "a lazy conjugate shard":
            ins[0] = ins[0].conj()
        elif how == "a tensor instead of a list":
            ins = ins[0]
        elif how == "a meta out tensor":
            kwargs["out"] = [torch.empty(b.sizes, device="meta") for b in dst.boxes_of(rank)]
        else:
            raise AssertionError(how)
    return reshard(ins, src, dst, **kwargs)


class Interrupted(Exception):
    """Stands for whatever made one rank leave a call early (a signal, a bug of ours)."""


def run_retry_after_leaving(
    rank: int, world: int, src: Layout, dst: Layout, full: torch.Tensor, bad_rank: int
) -> list[torch.Tensor]:
    """``bad_rank`` leaves its call before the agreement (the others wait in it), catches the
    error and retries with other data; the others run the one call."""
    ins = _mine(src, rank, full)
    if rank != bad_rank:
        return reshard(ins, src, dst)
    real = executor.agree_on_inputs

    def leave(*args: Any, **kwargs: Any) -> Any:
        raise Interrupted("left early")

    executor.agree_on_inputs = leave  # type: ignore[assignment]
    try:
        reshard(ins, src, dst)
    except Interrupted:
        pass
    finally:
        executor.agree_on_inputs = real
    return reshard([t * 2 for t in ins], src, dst)


def all_raise(answers: list[Any], *needles: str) -> str:
    """Every rank raised the same ReshardError, whose message holds every needle."""
    from shardspec.testing import RankFailure

    assert all(isinstance(a, RankFailure) for a in answers), f"not every rank raised: {answers}"
    assert {a.type_name for a in answers} == {"ReshardError"}, answers
    messages = {a.message for a in answers}
    assert len(messages) == 1, f"ranks raised different messages: {messages}"
    msg = messages.pop()
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def run_state_dict_kwargs(
    rank: int,
    world: int,
    state: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    kwargs: dict[str, Any],
) -> dict[str, list[torch.Tensor]]:
    return reshard_state_dict(state, src, dst, **kwargs)
