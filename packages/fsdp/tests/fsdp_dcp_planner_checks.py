"""Rank-side functions for test_dcp_planner_fsdp.py: save a model's sharded state dict with
DCP (FSDP1 + TP with shardspec's extension, FSDP2 + TP, FSDP2, FSDP1), load it into another
model/world with shardspec's LoadPlanner and with DCP's default, and report what differs:
between the two planners bit for bit, and against the reference model's tensors at the boxes
FSDP-1 gives each rank (the package's own oracle, fsdp_world_checks)."""

from __future__ import annotations

from typing import Any

import torch

from shardspec.reshard.reference import same_bits
from shardspec.testing.fsdp_model import (
    LINEARS,
    check_dtensor_entries as _check_dtensor_entries,
    local_of as _local,
    make_model,
    tp_plan,
)


def _dims(kind: str, world: int) -> tuple[int, int]:
    return (world // 2, 2) if kind.endswith("_tp") else (world, 1)


def _state_dict(kind: str, world: int, seed: int) -> tuple[Any, dict[str, Any]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from shardspec.fsdp import install

    dp, tp = _dims(kind, world)
    model = make_model(seed)
    if kind.endswith("_tp"):
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan())
        dp_mesh = mesh["dp"]
    else:
        dp_mesh = init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",))
    if kind.startswith("fsdp2"):
        for i in LINEARS:
            fully_shard(model[i], mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        return model, model.state_dict()
    # FSDP1 + TP with an uneven TP shard needs shardspec's extension (upstream aborts gloo).
    model = FSDP(model, device_mesh=dp_mesh, device_id=torch.device("cpu"))
    install(model)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return model, model.state_dict()


def save_model(rank: int, world: int, path: str, kind: str) -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import SavePlanner

    _, sd = _state_dict(kind, world, seed=0)
    dcp.save({"model": sd}, checkpoint_id=path, planner=SavePlanner())


def load_model(rank: int, world: int, path: str, kind: str) -> dict[str, list[str]]:
    """Load the checkpoint into a fresh ``kind`` model (other initial values) twice, with our
    planner and with the default; report the differences."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from shardspec.checkpoint.dcp import LoadPlanner

    ref = {k: v.detach().clone() for k, v in make_model(0).state_dict().items()}
    dp, tp = _dims(kind, world)
    loaded = {}
    out: dict[str, list[str]] = {}
    for name, planner in (("ours", LoadPlanner()), ("default", DefaultLoadPlanner())):
        _, sd = _state_dict(kind, world, seed=321)
        dcp.load({"model": sd}, checkpoint_id=path, planner=planner)
        out[name] = _check_dtensor_entries(sd, ref, rank, dp, tp, f"{kind} load ({name})")
        loaded[name] = {k: [t.clone() for t in _locals(v)] for k, v in sd.items()}
    out["same"] = [
        f"rank {rank} {k}: our planner loaded other bytes than the default"
        for k, ts in loaded["ours"].items()
        if len(ts) != len(loaded["default"][k])
        or not all(same_bits(a, b) for a, b in zip(ts, loaded["default"][k]))
    ]
    out["keys"] = sorted(loaded["ours"])
    return out


def _locals(v: Any) -> list[torch.Tensor]:
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor

    if isinstance(v, ShardedTensor):
        return [s.tensor for s in v.local_shards()]
    return [_local(v)]
