"""Every rank of a large mesh in one thread: torch's ``LocalTensorMode`` on the fake process
group (``torch.distributed._local_tensor``).

Under ``LocalTensorMode`` a tensor is a ``LocalTensor`` holding one value per simulated rank;
each tensor operation runs once per rank and each collective moves those values between
ranks, with the fake process group as the default group of world W. DTensor reads its rank
from the DeviceMesh (which the mode answers per rank), so upstream ``distribute_tensor``,
``redistribute``, ``full_tensor`` and ``__create_chunk_list__`` run unchanged and give every
rank's local shard from one Python program, without W threads.

:class:`LocalTensorPool` has :class:`~shardspec.testing.pool.RankPool`'s ``run`` for the named
operations of :mod:`.ops`: the operation runs once, as every rank, and its result is split into
one :class:`RankResult` per rank.

What it cannot run: code whose Python takes a different path on each rank. One program runs
for all ranks, so ``dist.get_rank()`` has no single answer; inside a world it raises
:class:`SingleProgramError` rather than answer 0 for every rank (shardspec's own frontends
compute their boxes from the rank in Python: they run on the pooled and threaded ranks).
Meshes must list their ranks as a strided layout (ascending row-major is): torch 2.13's
collectives under the mode recurse without end on a permuted rank list.
"""

from __future__ import annotations

import contextlib
import importlib
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .ops import Context, execute
from .results import RankError, RankFailure, RankResult

__all__ = ["LocalTensorPool", "SingleProgramError", "local_world", "per_rank"]


class SingleProgramError(RuntimeError):
    """Code under a :func:`local_world` needs one rank's own answer: it asked for the rank it
    runs as, or branched on a value that differs between ranks (LocalTensorMode asserts when
    a per-rank int meets a Python comparison). A limit of the simulation, not a verdict on
    the code: run it on pooled or threaded ranks."""


def _beyond_one_program(error: str) -> bool:
    # The innermost frame of the traceback says whose the failure is: the mode's own
    # assertions live in torch/distributed/_local_tensor/.
    frames = [line for line in error.splitlines() if line.lstrip().startswith("File ")]
    last = error.strip().splitlines()[-1] if error.strip() else ""
    return last.startswith(f"{__name__}.SingleProgramError") or bool(
        frames and "/torch/distributed/_local_tensor/" in frames[-1]
    )


def _hoisted_get_coordinate(self: Any) -> Any:
    # LocalTensorMode's own get_coordinate remaps the mesh layout to a rank tensor once per
    # simulated rank, under the mode, although the remap does not depend on the rank: W*W
    # dispatches (36 s of a 40 s distribute_tensor at W=256 here). The same answer, with the
    # remap done once and outside the mode.
    from torch.distributed._local_tensor import LocalIntNode, enabled_local_tensor_mode

    lm = enabled_local_tensor_mode()
    if lm is None:
        raise AssertionError("get_coordinate outside LocalTensorMode")
    key = id(self)
    cached = lm._coordinate_cache.get(key)
    if cached is not None:
        return cached
    with lm.disable():
        full = self._layout.remap_to_tensor(self._rank_map.clone())
        coords: list[dict[int, int]] = [{} for _ in range(self.ndim)]
        for r in lm.ranks:
            where = (full == r).nonzero().tolist()
            if len(where) != 1:
                raise AssertionError(f"rank {r} sits {len(where)} times in the mesh")
            for d, c in enumerate(where[0][1:]):
                coords[d][r] = c
    out = [torch.SymInt(LocalIntNode(c)) for c in coords]  # type: ignore[no-untyped-call]
    lm._coordinate_cache[key] = out
    return out


def _no_single_rank(*_: Any, **__: Any) -> int:
    raise SingleProgramError(
        "dist.get_rank() under LocalTensorMode: one program runs as every rank, so there is "
        "no single rank to return; read the rank from a DeviceMesh (get_coordinate), or run "
        "this code on pooled or threaded ranks"
    )


@contextlib.contextmanager
def local_world(world: int) -> Iterator[Any]:
    """A fake default process group of ``world`` ranks and ``LocalTensorMode`` over all of
    them, in this thread; torn down on exit. Refuses to start where this thread already has a
    default process group."""
    import torch.distributed as dist
    import torch.distributed._local_tensor as lt
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world < 1:
        raise ValueError(f"a local world needs at least 1 rank, got {world}")
    if dist.is_initialized():
        raise RuntimeError(
            "local_world needs this thread without a default process group "
            f"(it has one of backend {dist.get_backend()!r})"
        )
    dist.init_process_group("fake", world_size=world, rank=0, store=FakeStore())
    # Since torch 2.14 the mode installs its own dist.get_rank (a per-rank SymInt, from
    # _LocalDist) each time it enables itself, on entry and after every `disable()`, over
    # whatever stood there: the guard goes where the mode takes its replacement from, as
    # get_coordinate does. torch 2.13 replaces nothing, so the guard also stands in dist.
    local_dist = getattr(lt, "_LocalDist", None)
    saved = (
        lt._LocalDeviceMesh.get_coordinate,
        dist.get_rank,
        None if local_dist is None else local_dist.__dict__["get_rank"],
    )
    lt._LocalDeviceMesh.get_coordinate = staticmethod(_hoisted_get_coordinate)  # type: ignore[assignment]
    dist.get_rank = _no_single_rank
    if local_dist is not None:
        local_dist.get_rank = staticmethod(_no_single_rank)
    try:
        with lt.LocalTensorMode(frozenset(range(world))) as mode:
            yield mode
    finally:
        lt._LocalDeviceMesh.get_coordinate = staticmethod(saved[0])  # type: ignore[assignment]
        dist.get_rank = saved[1]
        if local_dist is not None:
            local_dist.get_rank = saved[2]
        dist.destroy_process_group()


def per_rank(value: Any, rank: int) -> Any:
    """Rank ``rank``'s part of a value computed under :func:`local_world`: a ``LocalTensor``'s
    tensor or a local ``SymInt``'s int for that rank, through lists, tuples and dicts."""
    from torch.distributed._local_tensor import LocalIntNode, LocalTensor

    if isinstance(value, LocalTensor):
        return value._local_tensors[rank]
    if isinstance(value, torch.SymInt):  # one int per rank, or one for all (a constant)
        if isinstance(value.node, LocalIntNode):
            return int(value.node._local_ints[rank])
        return int(value.node.val)
    if isinstance(value, dict):
        return {k: per_rank(v, rank) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [per_rank(v, rank) for v in value]
    return value


class LocalTensorPool:
    """W simulated ranks in this thread under ``LocalTensorMode``, with the ``run`` of a pool.
    Every call builds its world afresh (a fake group costs nothing to make), so a failed call
    leaves nothing behind."""

    single_program = True
    backend = "fake"
    device = "cpu"

    def __init__(self, world_size: int, *, ops: Sequence[str] = ()) -> None:
        if world_size < 1:
            raise ValueError(f"a pool needs at least 1 rank, got {world_size}")
        self.world_size = world_size
        for module in ops:
            importlib.import_module(module)  # registers its named operations

    def run(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        per_rank_tensors: Sequence[Sequence[torch.Tensor]] | None = None,
        example: str | None = None,
        timeout: float | None = None,
    ) -> list[RankResult]:
        """Run the named operation ``op`` once, as every rank; each rank's result in rank
        order. ``per_rank_tensors`` is refused: one program gets one input."""
        del timeout  # nothing here can hang on another rank: it is one thread
        if per_rank_tensors is not None:
            raise ValueError(
                "LocalTensorPool.run takes one set of input tensors for all ranks; per-rank "
                "inputs need pooled or threaded ranks"
            )
        args = dict(args or {})
        desc = example if example is not None else f"{op}({args})"
        try:
            with local_world(self.world_size):
                ctx = Context(rank=0, world=self.world_size, backend=self.backend)
                phase, outcome = execute(ctx, op, args, list(tensors))
                value, outs = outcome.value, list(outcome.tensors)
        except Exception as e:  # making or tearing down the world: execute catches the rest
            raise RankError(
                f"the LocalTensorMode world of {self.world_size} ranks for {op} raised "
                f"{type(e).__name__}: {e}\nexample: {desc}",
                [RankFailure(0, type(e).__name__, str(e), traceback.format_exc(), "world")],
            ) from e
        if outcome.error is not None and _beyond_one_program(outcome.error):
            raise SingleProgramError(
                f"{op} takes a different Python path on different ranks, which one program "
                f"for {self.world_size} ranks (LocalTensorMode) cannot follow:\n"
                f"{outcome.error.strip().splitlines()[-1]}\nexample: {desc}"
            )
        if outcome.error is not None or outcome.aborted:
            error = outcome.error or ""
            last = error.strip().splitlines()[-1] if error.strip() else "aborted"
            raise RankError(
                f"{op} under LocalTensorMode ({self.world_size} ranks) failed in {phase}: "
                f"{last}\nexample: {desc}\n{error}",
                [RankFailure(0, last.partition(":")[0], last, error, phase)],
            )
        return [
            RankResult(r, per_rank(value, r), [per_rank(t, r) for t in outs])
            for r in range(self.world_size)
        ]

    def close(self) -> None:
        """Nothing runs between calls; here for the pool interface."""
