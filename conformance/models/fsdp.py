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
    fsdp2_on_mesh,
    make_model,
    reference_step,
    tp_plan,
)

__all__ = [
    "RESUME_MESHES",
    "RESUME_SOURCES",
    "fsdp1_tp_world",
    "fsdp2_tp_world",
    "resume_world",
    "run_world",
]

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


# Resume meshes of the 4-rank worlds, as (*outer, dp, tp): FSDP alone, FSDP x TP, TP alone
# (FSDP over one rank) and HSDP (replicate 2 x shard 2).
RESUME_MESHES = ((4, 1), (2, 2), (1, 4), (2, 2, 1))
RESUME_SOURCES = ("sharded", "full", "unsharded")


def _full(value: Any) -> Any:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def resume_world(rank: int, world: int, cases: list[list[Any]]) -> dict[str, list[str]]:
    """For each ``[src mesh, dst mesh, source]``: one Adam step of the model, its state dicts
    taken as ``source`` says ("sharded": FSDP2 on the source mesh, get_*_state_dict; "full":
    the same with full_state_dict=True; "unsharded": a plain run's own state dicts), resharded
    by ``shardspec.fsdp.reshard_for`` for an FSDP2 model on the destination mesh and loaded
    with set_*_state_dict. Every parameter and Adam state (exp_avg, exp_avg_sq, step) must
    then equal the plain model's after its one step (FSDP-12)."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.tensor import DTensor

    from shardspec.fsdp import reshard_for

    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    ref(x).sum().backward()
    ref_opt.step()
    ref_params = dict(ref.named_parameters())
    ref_state = {n: ref_opt.state[p] for n, p in ref_params.items()}
    bad: list[str] = []
    for src_shape, dst_shape, source in cases:
        label = f"{source} {tuple(src_shape)} -> {tuple(dst_shape)}"
        if source == "unsharded":
            msd, osd = get_model_state_dict(ref), get_optimizer_state_dict(ref, ref_opt)
        else:
            src = fsdp2_on_mesh(make_model(), tuple(src_shape))
            opt = torch.optim.Adam(src.parameters(), lr=0.1)
            src(x).sum().backward()
            opt.step()
            options = StateDictOptions(full_state_dict=source == "full")
            msd = get_model_state_dict(src, options=options)
            osd = get_optimizer_state_dict(src, opt, options=options)
        dst = fsdp2_on_mesh(make_model(seed=5), tuple(dst_shape))
        dst_opt = torch.optim.Adam(dst.parameters(), lr=0.1)
        new_msd, new_osd = reshard_for(dst, msd, osd)
        assert new_osd is not None
        params = dict(dst.named_parameters())
        # What reshard_for returns is laid out as the destination's own: every entry shaped
        # like its parameter is a DTensor on the parameter's mesh and placements, holding the
        # parameter's local shape (a plain whole copy would still load through
        # set_optimizer_state_dict, which shards it again, and hide the slip)
        for k, p in params.items():
            states = new_osd["state"].get(k, {})
            for what, v in [("parameter", new_msd[k]), *states.items()]:
                if not isinstance(v, torch.Tensor) or v.shape != p.shape:
                    continue
                if not isinstance(v, DTensor):
                    bad.append(f"{label} {k} {what}: {type(v).__name__}, not a DTensor")
                elif (v.device_mesh, v.placements) != (p.device_mesh, p.placements):
                    bad.append(
                        f"{label} {k} {what}: on {v.placements}, the parameter on {p.placements}"
                    )
                elif v.to_local().shape != p.to_local().shape:
                    bad.append(f"{label} {k} {what}: local {tuple(v.to_local().shape)}")
        set_model_state_dict(dst, new_msd)
        set_optimizer_state_dict(dst, dst_opt, new_osd)
        for k, p in dst.named_parameters():
            if not torch.allclose(_full(p), ref_params[k], atol=1e-5, rtol=0):
                bad.append(f"{label} {k}: parameter differs from the plain model's")
            state = dst_opt.state.get(p, {})
            for s in ("exp_avg", "exp_avg_sq"):
                if s not in state:
                    bad.append(f"{label} {k}: no {s} after the load")
                elif not torch.allclose(_full(state[s]), ref_state[k][s], atol=1e-5, rtol=0):
                    bad.append(f"{label} {k}: {s} differs from the plain model's")
            if "step" in state and float(state["step"]) != 1.0:
                bad.append(f"{label} {k}: step is {float(state['step'])}, not 1")
    return {"resume": bad}
