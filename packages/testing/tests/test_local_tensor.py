"""One program for every rank (LocalTensorMode on the fake process group): upstream DTensor's
pieces of every rank of a large mesh from one call, split per rank as a pool's results; code
that needs one rank's own answer is refused with SingleProgramError, never answered as rank 0."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from shardspec.testing import RankError
from shardspec.testing.local_tensor import (
    LocalTensorPool,
    SingleProgramError,
    _hoisted_get_coordinate,
    local_world,
    per_rank,
)
from shardspec.testing.ops import Context, operation

OPS = (__name__,)


@operation("test.local.grid", collective=True)
def _grid(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = ctx.mesh(tuple(args["mesh"]))
    dt = distribute_tensor(ts[0], mesh, [Shard(0), Shard(1)], src_data_rank=None)
    return {"coordinate": mesh.get_coordinate()}, [dt.to_local(), dt.full_tensor()]


@operation("test.local.rank", collective=True)
def _rank(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    return {"rank": dist.get_rank()}, []


@operation("test.local.rank_after_disable", collective=True)
def _rank_after_disable(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[Any]]:
    # torch's own helpers (rank_map, tensor_map, the coordinate lookup) step out of the mode
    # and back in; since torch 2.14 each step back in installs the mode's dist.get_rank anew
    from torch.distributed._local_tensor import enabled_local_tensor_mode

    mode = enabled_local_tensor_mode()
    assert mode is not None
    with mode.disable():
        pass
    return {"rank": dist.get_rank()}, []


@operation("test.local.raise", collective=True)
def _raise(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    raise ValueError("a hand-made refusal")


@pytest.mark.rule("CONF-12")
@pytest.mark.parametrize(
    ("rows", "cols", "mesh"), [(7, 5, (2, 4)), (300, 3, (4, 64)), (3, 2, (2, 8))]
)
def test_every_rank_gets_its_own_piece_from_one_call(rows: int, cols: int, mesh: Any) -> None:
    world = mesh[0] * mesh[1]
    t = torch.arange(rows * cols).reshape(rows, cols)
    results = LocalTensorPool(world, ops=OPS).run("test.local.grid", {"mesh": list(mesh)}, [t])
    assert [r.rank for r in results] == list(range(world))

    # the chunk rule by hand: ceil-sized pieces, the missing ones empty
    def piece(n: int, k: int, i: int) -> range:
        step = -(-n // k)
        return range(min(i * step, n), min((i + 1) * step, n))

    for r in results:
        i, j = divmod(r.rank, mesh[1])
        assert r.value["coordinate"] == [i, j]
        want = t[list(piece(rows, mesh[0], i))][:, list(piece(cols, mesh[1], j))]
        assert torch.equal(r.tensors[0], want), f"rank {r.rank}"
        assert torch.equal(r.tensors[1], t), f"rank {r.rank} full_tensor"
    assert not dist.is_initialized()  # the world is gone with the call


class _NotAnException(BaseException):
    """What DCP's CheckpointException is: a BaseException, not an Exception."""


@operation("test.local.base", collective=True)
def _base(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    raise _NotAnException("like DCP's CheckpointException")


@pytest.mark.rule("CONF-2")
def test_an_operation_raising_a_base_exception_fails_the_call_like_any_other() -> None:
    # execute() is the same on pooled ranks, where an escaping BaseException killed the rank
    with pytest.raises(RankError, match="like DCP's CheckpointException"):
        LocalTensorPool(2, ops=OPS).run("test.local.base")
    assert not dist.is_initialized()


@pytest.mark.rule("CONF-12")
def test_asking_for_the_one_rank_is_refused_not_answered_as_rank_0() -> None:
    with pytest.raises(SingleProgramError, match="get_rank"):
        LocalTensorPool(8, ops=OPS).run("test.local.rank")
    assert dist.get_rank is not None and not dist.is_initialized()


@pytest.mark.rule("CONF-12")
def test_the_refusal_holds_after_the_mode_steps_out_and_back_in() -> None:
    import torch.distributed._local_tensor as lt

    torchs = (dist.get_rank, getattr(lt, "_LocalDist", None) and lt._LocalDist.get_rank)
    with pytest.raises(SingleProgramError, match="get_rank"):
        LocalTensorPool(4, ops=OPS).run("test.local.rank_after_disable")
    # and torch's own functions are back once the world is gone
    assert (dist.get_rank, getattr(lt, "_LocalDist", None) and lt._LocalDist.get_rank) == torchs


@pytest.mark.rule("CONF-12", "CONF-2")
def test_an_operation_that_raises_fails_the_call_and_the_next_call_runs() -> None:
    pool = LocalTensorPool(8, ops=OPS)
    with pytest.raises(RankError, match="a hand-made refusal"):
        pool.run("test.local.raise", example="the example's words")
    with pytest.raises(RankError, match="the example's words"):
        pool.run("test.local.raise", example="the example's words")
    t = torch.arange(8).reshape(8, 1)
    assert len(pool.run("test.local.grid", {"mesh": [8, 1]}, [t])) == 8


@pytest.mark.rule("CONF-12")
def test_per_rank_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="one set of input tensors"):
        LocalTensorPool(2, ops=OPS).run("test.local.grid", per_rank_tensors=[[], []])


@pytest.mark.rule("CONF-12")
def test_a_second_default_group_is_refused() -> None:
    with local_world(4), pytest.raises(RuntimeError, match="without a default process group"):  # noqa: SIM117 - the inner world is what raises
        with local_world(4):
            pass
    assert not dist.is_initialized()


@pytest.mark.rule("CONF-12")
@pytest.mark.parametrize("shape", [(2, 3, 4), (24,), (1, 4, 6), (3, 1, 2, 4)])
def test_the_hoisted_coordinates_are_the_modes_own(shape: tuple[int, ...]) -> None:
    import torch.distributed._local_tensor as lt
    from torch.distributed.device_mesh import init_device_mesh

    torchs = lt._LocalDeviceMesh.get_coordinate  # torch's, before local_world swaps it
    world = 1
    for s in shape:
        world *= s
    with local_world(world) as mode:
        names = tuple(f"d{i}" for i in range(len(shape)))
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for m in [mesh, *(mesh[n] for n in names if len(shape) > 1)]:
            mode._coordinate_cache.clear()
            ours = _hoisted_get_coordinate(m)
            mode._coordinate_cache.clear()
            want = torchs(m)
            for d in range(m.ndim):
                got = [per_rank(ours[d], r) for r in range(world)]
                assert got == [per_rank(want[d], r) for r in range(world)], f"mesh dim {d}"
