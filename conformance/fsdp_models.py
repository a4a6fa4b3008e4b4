"""What each rank runs in the conformance suite's real FSDP + TP model runs
(tests/test_fsdp_models.py). The model, TP plan and per-rank checks are shared with the fsdp
package's tests (``shardspec.testing.fsdp_model``); this module only picks which FSDP1
extension the implementation under test brings and keeps each world to the few checks the
area asks for, so a launch stays short."""

from __future__ import annotations

from typing import Any

from shardspec.testing import run_world
from shardspec.testing.fsdp_model import (
    DIMS,
    LINEARS,
    check_dtensor_entries as _check_dtensor_entries,
    make_model,
    reference_step,
    tp_plan,
)

__all__ = ["fsdp1_tp_world", "fsdp2_tp_world", "run_world"]

DP, TP = 2, 2


def _reference() -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in make_model().state_dict().items()}


def _step(model: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    import torch

    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    ref_params, ref_avg = reference_step(0, x)
    return opt, ref_params, ref_avg


def fsdp1_tp_world(rank: int, world: int, via: str) -> dict[str, list[str]]:
    """FSDP1 (device_mesh, device_id=cpu) over TP on the 2x2 mesh; the extension is ours when
    ``via`` is "shardspec", else upstream's default. SHARDED_STATE_DICT before and after one
    Adam step, and the sharded optimizer state, against the reference slices."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    model = make_model()
    parallelize_module(model, mesh["tp"], tp_plan())
    model = FSDP(model, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
    if via == "shardspec":
        from shardspec.fsdp import install

        install(model)
    out: dict[str, list[str]] = {}
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    out["state_dict"] = _check_dtensor_entries(sd, _reference(), rank, DP, TP, "param")
    opt, ref_params, ref_avg = _step(model)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd2 = model.state_dict()
        osd = FSDP.optim_state_dict(model, opt)
    out["after_step"] = _check_dtensor_entries(sd2, ref_params, rank, DP, TP, "param", 1e-5)
    avg = {k: s["exp_avg"] for k, s in osd["state"].items()}
    out["optim_state"] = _check_dtensor_entries(avg, ref_avg, rank, DP, TP, "exp_avg", 1e-5)
    return out


def fsdp2_tp_world(rank: int, world: int) -> dict[str, list[str]]:
    """fully_shard over TP on the 2x2 mesh (FSDP2 has no extension to choose): local
    parameters before and after one Adam step, and the optimizer state, against the
    reference slices."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    model = make_model()
    parallelize_module(model, mesh["tp"], tp_plan())
    for i in LINEARS:
        fully_shard(model[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    out: dict[str, list[str]] = {}
    out["params"] = _check_dtensor_entries(
        dict(model.named_parameters()), _reference(), rank, DP, TP, "fsdp2 param"
    )
    opt, ref_params, ref_avg = _step(model)
    out["after_step"] = _check_dtensor_entries(
        dict(model.named_parameters()), ref_params, rank, DP, TP, "fsdp2 param", 1e-5
    )
    avg = {n: opt.state[p]["exp_avg"] for n, p in model.named_parameters()}
    out["optim_state"] = _check_dtensor_entries(avg, ref_avg, rank, DP, TP, "exp_avg", 1e-5)
    return out
