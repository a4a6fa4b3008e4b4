"""The uneven FSDP + TP model the fsdp package's worlds and the conformance suite's model runs
share: the model, its TP plan, the one-step reference, and the check that a state dict's
entries hold, on this rank, exactly the box of FSDP-1 (spec/07-fsdp.md).

The boxes a check expects come from the chunk rule alone (:func:`truth_layout`), never from
``shardspec.fsdp``, whose rules the fsdp package's tests hold to this truth; the rest needs
torch and ``shardspec.metadata`` only."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Uneven on a 2x2 mesh: 7 rows over TP 2 -> [0,4) [4,7), then FSDP 2 -> 2,2 / 2,1; 14 -> 7,7
# -> 4,3; 6 -> 3,3 -> 2,1; the last Linear is outside the TP plan (3 rows over dp 2).
DIMS = (10, 7, 5, 14, 6, 3)
LINEARS = (0, 2, 4, 6, 8)


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(DIMS) - 1):
        layers += [nn.Linear(DIMS[i], DIMS[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# The TP placement of each parameter in the plan: the dim it is sharded on, None replicated.
TP_DIM: dict[str, int | None] = {
    "0.weight": 0,
    "0.bias": 0,
    "2.weight": 1,
    "2.bias": None,
    "4.weight": 0,
    "4.bias": 0,
    "6.weight": 1,
    "6.bias": None,
}


def tp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    # Colwise hands Rowwise a DTensor: a plain local activation would be rebuilt with
    # from_local, which assumes even shards and breaks on the uneven hidden dim of 7.
    return {
        "0": ColwiseParallel(use_local_output=False),
        "2": RowwiseParallel(),
        "4": ColwiseParallel(use_local_output=False),
        "6": RowwiseParallel(),
    }


def fsdp2_on_mesh(model: nn.Sequential, shape: tuple[int, ...]) -> nn.Sequential:
    """``model`` (:func:`make_model`'s) under FSDP2 on a (*outer, dp, tp) mesh of the world:
    TP when tp > 1, HSDP over (outer, dp) when there is an outer dim."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    names = (*(f"rep{i}" for i in range(len(shape) - 2)), "dp", "tp")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    if shape[-1] > 1:
        parallelize_module(model, mesh["tp"], tp_plan())
    fsdp_mesh = mesh[names[:-1]] if len(shape) > 2 else mesh["dp"]
    for i in LINEARS:
        fully_shard(model[i], mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh)
    return model


def clean(fqn: str) -> str:
    for junk in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "module."):
        fqn = fqn.replace(junk, "")
    return fqn


def expected_box(name: str, shape: tuple[int, ...], rank: int, dp: int, tp: int) -> Any:
    (box,) = truth_layout(name, shape, dp, tp).boxes_of(rank)
    return box


def local_of(v: Any) -> torch.Tensor:
    """A DTensor's local tensor, or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return v.to_local() if isinstance(v, DTensor) else v


def check_dtensor_entries(
    sd: dict[str, Any],
    ref: dict[str, torch.Tensor],
    rank: int,
    dp: int,
    tp: int,
    what: str,
    atol: float = 0.0,
) -> list[str]:
    """Every entry of ``sd`` that names a reference tensor holds, on this rank, exactly the box
    of FSDP-1, and says so: a DTensor's placements claim that box, a (flat) ShardedTensor's
    local shard sits at it and its metadata gives every box of FSDP-1 with a real owner."""
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor

    from shardspec.metadata import Box, dtensor_layout, from_sharded_tensor_metadata

    bad: list[str] = []
    seen = set()
    for key, value in sd.items():
        name = clean(key)
        if name not in ref:
            continue
        seen.add(name)
        full = ref[name]
        box = expected_box(name, tuple(full.shape), rank, dp, tp)
        if isinstance(value, ShardedTensor):
            (shard,) = value.local_shards()
            local = shard.tensor
            got = Box(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
            if got != box:
                bad.append(f"{what} {name} rank {rank}: local shard at {got}, data is {box}")
            layout = from_sharded_tensor_metadata(value.metadata(), validate=False)
            layout.validate()
            truth_l = truth_layout(name, tuple(full.shape), dp, tp)
            for s in layout.shards:
                if s.box not in truth_l.boxes_of(s.rank):
                    bad.append(f"{what} {name}: metadata gives {s.box} to rank {s.rank}")
        elif isinstance(value, DTensor):
            local = value.to_local()
            claimed = dtensor_layout(tuple(value.shape), value.device_mesh, value.placements)
            mine = claimed.boxes_of(rank)
            if mine != (box,) and not (box.is_empty and all(b.is_empty for b in mine)):
                bad.append(
                    f"{what} {name} rank {rank}: placements {value.placements} claim "
                    f"{mine}, data is {box}"
                )
        else:
            bad.append(f"{what} {name}: {type(value).__name__}, not a DTensor or ShardedTensor")
            continue
        want = full[box.slices()]
        if tuple(local.shape) != tuple(want.shape) or not torch.allclose(
            local.float(), want.float(), atol=atol, rtol=0
        ):
            bad.append(f"{what} {name} rank {rank}: local {tuple(local.shape)} != ref box {box}")
    if seen != set(ref):
        bad.append(f"{what}: checked {sorted(seen)}, but should be {sorted(ref)}")
    return bad


def truth_layout(name: str, shape: tuple[int, ...], dp: int, tp: int) -> Any:
    """FSDP-1 by the chunk rule alone: TP chunks its dim over ``tp`` (a parameter outside the
    TP plan, or replicated by it, is whole on every TP coordinate), then FSDP chunks dim 0 of
    that piece over ``dp``; a zero-size dim sits at the end of the tensor. Rank ``p * tp + t``
    holds FSDP coordinate ``p`` of TP coordinate ``t`` (the (dp, tp) mesh, row-major)."""
    from shardspec.metadata import Box, Layout, Shard, chunk_bounds

    tp_dim = TP_DIM.get(name)
    shards = []
    for p in range(dp):
        for t in range(tp):
            offsets, sizes = [0] * len(shape), list(shape)
            if tp_dim is not None:
                lo, hi = chunk_bounds(shape[tp_dim], tp)[t]
                offsets[tp_dim], sizes[tp_dim] = lo, hi - lo
            # FSDP chunks the TP piece as a local tensor: its own extent, then back to global
            lo, hi = chunk_bounds(sizes[0], dp)[p]
            offsets[0], sizes[0] = (offsets[0] if sizes[0] else 0) + lo, hi - lo
            at = [shape[d] if sizes[d] == 0 else offsets[d] for d in range(len(shape))]
            shards.append(Shard(Box(at, sizes), p * tp + t))
    return Layout(shape, shards)


def reference_step(seed: int, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One Adam step of the plain model: parameters and exp_avg after it."""
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    names = [k for k, _ in model.named_parameters()]
    avg = {names[i]: s["exp_avg"].clone() for i, s in enumerate(opt.state.values())}
    return params, avg
