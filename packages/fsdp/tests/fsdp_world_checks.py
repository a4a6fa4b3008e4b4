"""What each rank runs in the real FSDP + TP worlds; every function returns plain data
(``{check name: [failure messages]}`` plus facts) for the driver to assert on. The model and the
per-entry check are shared with the conformance suite (``shardspec.testing.fsdp_model``)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed.fsdp
from torch import nn

from shardspec.fsdp.rules import fsdp_tp_layout, placements_layout
from shardspec.metadata.placements import Replicate, ShardDim, from_torch
from shardspec.testing.fsdp_model import (
    DIMS,
    LINEARS,
    TP_DIM,
    check_dtensor_entries as _check_dtensor_entries,
    clean,
    expected_box,
    make_model,
    reference_step,
    tp_plan,
)

TP_OF = {k: Replicate() if d is None else ShardDim(d) for k, d in TP_DIM.items()}


def fsdp1_world(
    rank: int, world: int, use_ours: bool, ckpt_dir: str, dp: int = 2, tp: int = 2
) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    from torch.distributed.tensor.parallel import parallelize_module

    from shardspec.fsdp import install

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    ref_model = make_model()
    ref = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}
    model = make_model()
    parallelize_module(model, mesh["tp"], tp_plan())
    # use_orig_params=False: with True, FSDP1's optim_state_dict reshapes uneven TP state to
    # local size * TP size (_unflatten_orig_param_states) and fails for 7 rows over 2.
    model = FSDP(model, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
    out: dict[str, Any] = {}
    if use_ours:
        ext = install(model)
        from torch.distributed.fsdp._traversal_utils import _get_fsdp_handles, _get_fsdp_states

        out["install"] = [
            f"state {i} has {type(s._fsdp_extension).__name__}"
            for i, s in enumerate(_get_fsdp_states(model))
            if s._fsdp_extension is not ext
        ] + [
            f"handle {i} has {type(h._fsdp_extension).__name__}"
            for i, h in enumerate(_get_fsdp_handles(model))
            if h._fsdp_extension is not ext
        ]
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    out["state_dict"] = _check_dtensor_entries(sd, ref, rank, dp, tp, "param")
    out["install_global"] = []
    if use_ours:
        # install() without a model: FSDP builds ours for every state wrapped afterwards
        from torch.distributed.fsdp import _init_utils
        from torch.distributed.fsdp._traversal_utils import _get_fsdp_states

        saved = _init_utils.DTensorExtensions
        try:
            g_ext = install()
            m5 = make_model()
            parallelize_module(m5, mesh["tp"], tp_plan())
            m5 = FSDP(m5, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
            out["install_global"] = [
                f"state {i}: {type(st_._fsdp_extension).__name__}"
                for i, st_ in enumerate(_get_fsdp_states(m5))
                if st_._fsdp_extension is not g_ext
            ]
            with FSDP.state_dict_type(m5, StateDictType.SHARDED_STATE_DICT):
                out["install_global"] += _check_dtensor_entries(
                    m5.state_dict(), ref, rank, dp, tp, "param (global install)"
                )
        finally:
            _init_utils.DTensorExtensions = saved

    # One Adam step, then parameters and optimizer state against the plain model's.
    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    ref_params, ref_avg = reference_step(0, x)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd2 = model.state_dict()
        osd = FSDP.optim_state_dict(model, opt)
    out["after_step"] = _check_dtensor_entries(sd2, ref_params, rank, dp, tp, "param", 1e-5)
    avg = {k: s["exp_avg"] for k, s in osd["state"].items()}
    out["optim_state"] = _check_dtensor_entries(avg, ref_avg, rank, dp, tp, "exp_avg", 1e-5)
    # Loading the sharded optimizer state back (upstream: _flatten_optim_state gathers each TP
    # DTensor to its global shape and compares it with the TP-local parameter shape).
    try:
        opt2 = torch.optim.Adam(model.parameters(), lr=0.1)
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            opt2.load_state_dict(FSDP.optim_state_dict_to_load(model, opt2, osd))
        optim_load: Any = [
            f"rank {rank}: reloaded {name} of flat parameter {i} differs"
            for i, prm in enumerate(model.parameters())
            for name in ("exp_avg", "exp_avg_sq")
            if not torch.allclose(opt2.state[prm][name], opt.state[prm][name], atol=1e-6, rtol=0)
        ]
    except Exception as e:
        optim_load = f"raised {type(e).__name__}: {e}"
    out["optim_load_ours"] = []
    if use_ours:
        from shardspec.fsdp.optim import optim_state_dict_to_load

        opt3 = torch.optim.Adam(model.parameters(), lr=0.1)
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            opt3.load_state_dict(optim_state_dict_to_load(model, opt3, osd))
        out["optim_load_ours"] = [
            f"rank {rank}: reloaded {name} of flat parameter {i} differs"
            for i, prm in enumerate(model.parameters())
            for name in ("exp_avg", "exp_avg_sq")
            if not torch.allclose(opt3.state[prm][name], opt.state[prm][name], atol=1e-6, rtol=0)
        ]
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig

    with FSDP.state_dict_type(
        model,
        StateDictType.SHARDED_STATE_DICT,
        ShardedStateDictConfig(offload_to_cpu=True),
        ShardedOptimStateDictConfig(offload_to_cpu=True),
    ):
        osd_cpu = FSDP.optim_state_dict(model, opt)
    avg_cpu = {k: s["exp_avg"] for k, s in osd_cpu["state"].items()}
    out["optim_state_offload"] = _check_dtensor_entries(
        avg_cpu, ref_avg, rank, dp, tp, "offloaded exp_avg", 1e-5
    )

    # DCP: save the 2-D state dict; read it back as full tensors (every rank reads the whole
    # tensor) and into a 1-D FSDP2 model over all 4 ranks.
    import torch.distributed.checkpoint as dcp

    out["facts"] = {
        "entry_types": {clean(k): type(v).__name__ for k, v in sd2.items()},
        "optim_load": optim_load,
    }
    dcp.save({"model": sd2}, checkpoint_id=ckpt_dir)
    full = {k: torch.zeros_like(v) for k, v in ref_params.items()}
    dcp.load({"model": full}, checkpoint_id=ckpt_dir)
    out["dcp_full"] = [
        f"dcp full {k}: max diff {float((full[k] - ref_params[k]).abs().max())}"
        for k in full
        if not torch.allclose(full[k], ref_params[k], atol=1e-5, rtol=0)
    ]
    if use_ours:
        fresh = make_model(seed=321)
        parallelize_module(fresh, mesh["tp"], tp_plan())
        fresh = FSDP(fresh, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
        install(fresh)
        with FSDP.state_dict_type(fresh, StateDictType.SHARDED_STATE_DICT):
            target = fresh.state_dict()
            dcp.load({"model": target}, checkpoint_id=ckpt_dir)
            fresh.load_state_dict(target)
            back = fresh.state_dict()
        out["dcp_fsdp1_load"] = _check_dtensor_entries(
            back, ref_params, rank, dp, tp, "reload", 1e-5
        )

    from torch.distributed.fsdp import fully_shard

    mesh1 = init_device_mesh("cpu", (world,), mesh_dim_names=("all",))
    m2 = make_model(seed=123)
    for i in LINEARS:
        fully_shard(m2[i], mesh=mesh1)
    fully_shard(m2, mesh=mesh1)
    sd3 = m2.state_dict()
    dcp.load({"model": sd3}, checkpoint_id=ckpt_dir)
    out["dcp_fsdp2_1d"] = [
        f"dcp -> FSDP2 dp=4 {k}: differs"
        for k, v in sd3.items()
        if not torch.allclose(v.full_tensor(), ref_params[k], atol=1e-5, rtol=0)
    ]
    return out


def fsdp2_world(rank: int, world: int, ckpt_dir: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    dp, tp = 2, 2
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    ref = {k: v.detach().clone() for k, v in make_model().state_dict().items()}
    model = make_model()
    parallelize_module(model, mesh["tp"], tp_plan())
    for i in LINEARS:
        fully_shard(model[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    out: dict[str, Any] = {}
    out["fsdp2_params"] = _check_dtensor_entries(
        dict(model.named_parameters()), ref, rank, dp, tp, "fsdp2 param"
    )
    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    ref_params, ref_avg = reference_step(0, x)
    out["fsdp2_after_step"] = _check_dtensor_entries(
        dict(model.named_parameters()), ref_params, rank, dp, tp, "fsdp2 param", 1e-5
    )
    avg = {n: opt.state[p]["exp_avg"] for n, p in model.named_parameters()}
    out["fsdp2_optim_state"] = _check_dtensor_entries(avg, ref_avg, rank, dp, tp, "exp_avg", 1e-5)

    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt_dir)
    full = {k: torch.zeros_like(v) for k, v in ref_params.items()}
    dcp.load({"model": full}, checkpoint_id=ckpt_dir)
    out["fsdp2_dcp_full"] = [
        f"dcp full {k}: differs"
        for k in full
        if not torch.allclose(full[k], ref_params[k], atol=1e-5)
    ]
    out.update(_chunk_and_flatten_checks(rank, mesh, ref, dp, tp))
    return out


def _chunk_and_flatten_checks(
    rank: int, mesh: Any, ref: dict[str, torch.Tensor], dp: int, tp: int
) -> dict[str, Any]:
    """ShardedTensor path: our chunk_tensor on the unsharded TP parameters (what FSDP1 hands
    its hook), then flatten_sharded_tensors, against the rules and the reference."""
    from torch.distributed.checkpoint._sharded_tensor_utils import _flatten_sharded_tensors
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from shardspec.fsdp import DTensorExtensions, flatten_sharded_tensors
    from shardspec.fsdp.flatten import layout_of
    from shardspec.fsdp.sharded import LAYOUT_ATTR
    from shardspec.metadata import Box

    ext = DTensorExtensions()
    dp_pg = mesh["dp"].get_group()
    p = mesh.get_coordinate()[0]
    tp_model = make_model()
    parallelize_module(tp_model, mesh["tp"], tp_plan())
    chunks = {
        n: ext.chunk_tensor(v.detach(), p, dp, 1, dp_pg) for n, v in tp_model.named_parameters()
    }
    bad_chunk: list[str] = []
    tp_ranks = mesh["tp"].mesh.tolist()
    for n, st in chunks.items():
        if n not in TP_OF:
            continue
        outer = layout_of(st)
        if TP_OF[n] != Replicate():
            owners = sorted(s.rank for s in outer.shards)
            if owners != sorted(tp_ranks):
                bad_chunk.append(
                    f"{n}: outer owners {owners}, but should be the TP group {tp_ranks}"
                )
        inner, shards = ext.pre_load_state_dict_transform(st)
        box = expected_box(n, tuple(ref[n].shape), rank, dp, tp)
        if len(shards) != 1 or not torch.equal(shards[0].tensor, ref[n][box.slices()]):
            bad_chunk.append(f"{n}: local chunk is not ref{box}")
        inner_owners = sorted(s.rank for s in layout_of(inner).shards)
        if inner_owners != sorted(mesh["dp"].mesh.tolist()):
            bad_chunk.append(f"{n}: inner owners {inner_owners}")
    bad_flat: list[str] = []
    flat = flatten_sharded_tensors({"m": dict(chunks)})["m"]
    for n, st in flat.items():
        if n not in TP_OF:
            continue
        truth_l = fsdp_tp_layout(tuple(ref[n].shape), TP_OF[n], dp=dp, tp_size=tp)
        got = layout_of(st)
        for s in got.shards:
            if s.box not in truth_l.boxes_of(s.rank):
                bad_flat.append(f"{n}: flat shard {s} is not what rank {s.rank} holds")
        if {s.box for s in got.shards} != {s.box for s in truth_l.shards}:
            bad_flat.append(f"{n}: flat boxes {got} differ from {truth_l}")
        (ls,) = st.local_shards()
        if not torch.equal(
            ls.tensor,
            ref[n][
                tuple(
                    slice(o, o + z)
                    for o, z in zip(ls.metadata.shard_offsets, ls.metadata.shard_sizes)
                )
            ],
        ):
            bad_flat.append(f"{n}: flat local data")
        if Box(ls.metadata.shard_offsets, ls.metadata.shard_sizes) != expected_box(
            n, tuple(ref[n].shape), rank, dp, tp
        ):
            bad_flat.append(f"{n}: flat local box {ls.metadata}")
    # the same without the attached layout: owners inferred from the two groups
    for n, st in chunks.items():
        if n in TP_OF and hasattr(st, LAYOUT_ATTR):
            delattr(st, LAYOUT_ATTR)
    flat2 = flatten_sharded_tensors({"m": chunks})["m"]
    for n in TP_OF:
        if layout_of(flat2[n]) != layout_of(flat[n]):
            bad_flat.append(
                f"{n}: inferred flat layout {layout_of(flat2[n])} != {layout_of(flat[n])}"
            )

    # An entry with no local FSDP chunk: Linear(10, 2) colwise, 1 row per TP rank over dp=2.
    small = nn.Linear(DIMS[0], 2)
    torch.manual_seed(5)
    small = nn.Linear(DIMS[0], 2)
    full_w = small.weight.detach().clone()
    parallelize_module(small, mesh["tp"], ColwiseParallel())
    facts: dict[str, Any] = {}
    from torch.distributed.tensor.parallel.fsdp import _chunk_tensor as upstream_chunk

    try:
        # upstream names a scapegoat rank (0 or 1) that is not in the TP group of ranks 2, 3
        up = upstream_chunk(small.weight.detach(), p, dp, 1, dp_pg)
        up_flat = _flatten_sharded_tensors({"w": up})
        facts["upstream_keeps_empty"] = "w" in up_flat
    except Exception as e:
        facts["upstream_keeps_empty"] = f"raised {type(e).__name__}: {e}"
    ours = flatten_sharded_tensors({"w": ext.chunk_tensor(small.weight.detach(), p, dp, 1, dp_pg)})
    if "w" not in ours:
        bad_flat.append("empty entry dropped")
    else:
        (ls,) = ours["w"].local_shards()
        want = fsdp_tp_layout((2, DIMS[0]), ShardDim(0), dp=dp, tp_size=tp).boxes_of(rank)
        got_box = Box(ls.metadata.shard_offsets, ls.metadata.shard_sizes)
        if (got_box,) != want or not torch.equal(ls.tensor, full_w[got_box.slices()]):
            bad_flat.append(f"small: rank {rank} flat box {got_box}, but should be {want}")
    # upstream's offsets for the uneven 7-row weight
    try:
        st_up = upstream_chunk(tp_model[0].weight.detach(), p, dp, 1, dp_pg)
        facts["upstream_outer_7"] = sorted(
            (tuple(m.shard_offsets), tuple(m.shard_sizes), str(m.placement))
            for m in st_up.metadata().shards_metadata
        )
    except Exception as e:
        facts["upstream_outer_7"] = f"raised {type(e).__name__}: {e}"
    return {"chunk_tensor": bad_chunk, "flatten": bad_flat, "facts": facts}


def fsdp2_full_tensor_world(
    rank: int, world: int, dp: int, tp: int, ckpt_dir: str
) -> dict[str, Any]:
    """FSDP2 + TP on dp x tp: is every local parameter FSDP-1's box (the data), do
    ``full_tensor()`` and a DCP round trip (which trusts the placements' offsets) give back
    the parameters?"""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    ref = {k: v.detach().clone() for k, v in make_model().state_dict().items()}
    model = make_model()
    parallelize_module(model, mesh["tp"], tp_plan())
    for i in LINEARS:
        fully_shard(model[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    data = []
    for n, prm in model.named_parameters():
        box = expected_box(n, tuple(ref[n].shape), rank, dp, tp)
        if not torch.equal(prm.to_local(), ref[n][box.slices()]):
            data.append(f"{n} rank {rank}: local data is not ref{box}")
    wrong_full = [
        n for n, prm in model.named_parameters() if not torch.equal(prm.full_tensor(), ref[n])
    ]
    import torch.distributed.checkpoint as dcp

    facts: dict[str, Any] = {"wrong_full_tensor": wrong_full}
    try:
        dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt_dir)
        full = {k: torch.zeros_like(v) for k, v in ref.items()}
        dcp.load({"model": full}, checkpoint_id=ckpt_dir)
        facts["wrong_after_dcp"] = [k for k in full if not torch.equal(full[k], ref[k])]
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        facts["wrong_after_dcp"] = f"raised {type(e).__name__}: {str(e)[:300]}"
    return {"fsdp2_data": data, "facts": facts}


def two_by_two_world(rank: int, world: int, ckpt1: str, ckpt2: str) -> dict[str, Any]:
    """Everything on the 2x2 mesh in one launch: FSDP1 with our hooks, then FSDP2."""
    out = fsdp1_world(rank, world, True, ckpt1, 2, 2)
    facts = out.pop("facts")
    out.update(fsdp2_world(rank, world, ckpt2))
    out["facts"].update(facts)
    out.update(conversions_world(rank, world))
    more = hooks_random_world(rank, world, 2, 2, random_cases(0, 60))
    out["hooks_random"] = more["hooks_random"]
    out["facts"]["hooks_kinds"] = more["facts"]["kinds"]
    return out


def three_by_two_world(rank: int, world: int, ckpt1: str, ckpt2: str) -> dict[str, Any]:
    """dp=3 x tp=2, where no DTensor placements describe 7 rows (FSDP-5): FSDP1 with our hooks
    (flat ShardedTensors there), then upstream FSDP2's own state dict through DCP."""
    out = fsdp1_world(rank, world, True, ckpt1, 3, 2)
    facts = out.pop("facts")
    more = fsdp2_full_tensor_world(rank, world, 3, 2, ckpt2)
    out["fsdp2_data"] = more["fsdp2_data"]
    out["facts"] = {**facts, **more["facts"]}
    hooks = hooks_random_world(rank, world, 3, 2, random_cases(1, 60))
    out["hooks_random"] = hooks["hooks_random"]
    out["facts"]["hooks_kinds"] = hooks["facts"]["kinds"]
    out["facts"]["resume_fsdp2_dp3_tp2"] = _resume_misdescribed_source(world)
    return out


def _resume_misdescribed_source(world: int) -> str:
    """reshard_for from FSDP2 + TP on dp=3 x tp=2 (whose placements misdescribe 7 rows) to
    FSDP2 on dp=6: the error every rank raises."""
    from torch.distributed.device_mesh import init_device_mesh

    from shardspec.fsdp import reshard_for

    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
    src = _fsdp2(make_model(), mesh["dp"], mesh["tp"])
    flat = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    dst = _fsdp2(make_model(seed=5), flat)
    try:
        reshard_for(dst, src.state_dict())
        return "no error"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def _check_pieces(
    local: dict[str, list[torch.Tensor]],
    layouts: dict[str, Any],
    ref: dict[str, torch.Tensor],
    rank: int,
    what: str,
    atol: float = 0.0,
) -> list[str]:
    bad = []
    for k, layout in layouts.items():
        name = clean(k)
        boxes = layout.boxes_of(rank)
        if len(boxes) != len(local[k]):
            bad.append(f"{what} {name}: {len(local[k])} tensors for boxes {boxes}")
            continue
        for b, t in zip(boxes, local[k]):
            want = ref[name][b.slices()]
            if tuple(t.shape) != tuple(want.shape) or not torch.allclose(
                t, want, atol=atol, rtol=0
            ):
                bad.append(f"{what} {name} rank {rank}: tensor for {b} is not the reference slice")
    return bad


def conversions_world(rank: int, world: int) -> dict[str, Any]:
    """FSDP1 2-D state dict <-> plain layouts <-> FSDP2 state dict, and resharding the 2-D
    parameters in memory to dp=4 and to tp=4 (FSDP-10)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from shardspec.fsdp import install
    from shardspec.fsdp.convert import model_layouts, reshard_layouts, to_layouts, to_state_dict

    dp, tp = 2, 2
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    mesh1 = init_device_mesh("cpu", (world,), mesh_dim_names=("all",))
    ref = {k: v.detach().clone() for k, v in make_model().state_dict().items()}
    shapes = {k: tuple(v.shape) for k, v in ref.items()}
    out: dict[str, Any] = {}

    m1 = make_model()
    parallelize_module(m1, mesh["tp"], tp_plan())
    m1 = FSDP(m1, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
    install(m1)
    with FSDP.state_dict_type(m1, StateDictType.SHARDED_STATE_DICT):
        sd1 = {clean(k): v for k, v in m1.state_dict().items()}
    loc1, lay1, _ = to_layouts(sd1)
    want = model_layouts(shapes, TP_OF, dp=dp, tp_size=tp)
    out["fsdp1_to_layouts"] = [
        f"fsdp1 {k}: layout {lay1[k]} is not FSDP-1's {want[k]}"
        for k in want
        if not lay1[k].equivalent(want[k])
    ] + _check_pieces(loc1, lay1, ref, rank, "fsdp1 piece")

    m2 = make_model()
    parallelize_module(m2, mesh["tp"], tp_plan())
    for i in LINEARS:
        fully_shard(m2[i], mesh=mesh["dp"])
    fully_shard(m2, mesh=mesh["dp"])
    loc2, lay2, _ = to_layouts(m2.state_dict())
    out["fsdp1_equals_fsdp2"] = [
        f"{k}: FSDP1 {lay1[k]} vs FSDP2 {lay2[k]}" for k in want if not lay1[k].equivalent(lay2[k])
    ] + [
        f"{k}: FSDP1 and FSDP2 local data differ"
        for k in want
        if not all(torch.equal(a, b) for a, b in zip(loc1[k], loc2[k]))
    ]

    # 2-D -> dp=4 -> tp=4, in memory
    to_dp4 = model_layouts(shapes, {}, dp=world, tp_size=1)
    to_tp4 = model_layouts(shapes, TP_OF, dp=1, tp_size=world)
    dp4 = reshard_layouts(loc1, lay1, to_dp4)
    tp4 = reshard_layouts(dp4, to_dp4, to_tp4)
    out["reshard"] = _check_pieces(dp4, to_dp4, ref, rank, "dp=4") + _check_pieces(
        tp4, to_tp4, ref, rank, "tp=4"
    )

    # FSDP1 2-D -> FSDP2 over 4 ranks: load the resharded pieces as DTensors
    m3 = make_model(seed=7)
    for i in LINEARS:
        fully_shard(m3[i], mesh=mesh1)
    fully_shard(m3, mesh=mesh1)
    m3.load_state_dict(to_state_dict(dp4, to_dp4, mesh1))
    out["fsdp1_to_fsdp2_dp4"] = [
        f"{k}: FSDP2 dp=4 full tensor differs"
        for k, v in m3.state_dict().items()
        if not torch.equal(v.full_tensor(), ref[k])
    ]

    # FSDP2 dp=4 -> FSDP1 2-D with our hooks
    loc3, lay3, _ = to_layouts(m3.state_dict())
    back = reshard_layouts(loc3, lay3, want)
    m4 = make_model(seed=9)
    parallelize_module(m4, mesh["tp"], tp_plan())
    m4 = FSDP(m4, device_mesh=mesh["dp"], device_id=torch.device("cpu"))
    install(m4)
    sd4 = to_state_dict(back, want, mesh)
    with FSDP.state_dict_type(m4, StateDictType.SHARDED_STATE_DICT):
        template = m4.state_dict()
        m4.load_state_dict({k: sd4[clean(k)] for k in template})
        again = m4.state_dict()
    out["fsdp2_to_fsdp1"] = _check_dtensor_entries(again, ref, rank, dp, tp, "fsdp2->fsdp1")
    return out


def random_cases(seed: int, n: int) -> list[dict[str, Any]]:
    """Cases for the hooks on real ranks: uneven splits, more ranks than rows, zero-size dims,
    1-d and 3-d tensors, every TP placement, several dtypes; the edges listed first."""
    import random

    rnd = random.Random(seed)
    dtypes = ["float32", "bfloat16", "int64", "bool", "complex64", "float64"]
    cases: list[dict[str, Any]] = [
        {"shape": [7, 10], "tp": "S0", "dtype": "float32"},
        {"shape": [5, 7], "tp": "S1", "dtype": "float32"},
        {"shape": [1, 3], "tp": "S0", "dtype": "int64"},
        {"shape": [0, 4], "tp": "S0", "dtype": "float32"},
        {"shape": [3, 0], "tp": "S1", "dtype": "bool"},
        {"shape": [2], "tp": "R", "dtype": "bfloat16"},
        {"shape": [6], "tp": "S0", "dtype": "complex64"},
    ]
    while len(cases) < n:
        nd = rnd.randint(1, 3)
        shape = [rnd.choice([0, 1, 2, 3, 5, 7, 9]) for _ in range(nd)]
        tp = rnd.choice(["R"] + [f"S{d}" for d in range(nd)])
        cases.append({"shape": shape, "tp": tp, "dtype": rnd.choice(dtypes)})
    return cases


def _global(case: dict[str, Any]) -> torch.Tensor:
    shape = case["shape"]
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.float64).reshape(shape) + 1
    dtype = getattr(torch, case["dtype"])
    if dtype is torch.bool:
        return (base.long() % 3 == 0).reshape(shape)
    if dtype is torch.complex64:
        return torch.complex(base.float(), -base.float())
    return base.to(dtype)


def hooks_random_world(
    rank: int, world: int, dp: int, tp: int, cases: list[dict[str, Any]], replicate: int = 1
) -> dict[str, Any]:
    """Our hooks on many random parameters: chunk_dtensor (DTensor or flat ShardedTensor),
    all_gather_dtensor back, chunk_tensor + flatten + pre_load, each against torch.chunk of
    torch.chunk of the global tensor."""
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import (
        DTensor,
        Replicate as TReplicate,
        Shard as TShard,
        distribute_tensor,
    )

    from shardspec.fsdp import DTensorExtensions, flatten_sharded_tensors
    from shardspec.fsdp.flatten import layout_of
    from shardspec.metadata import Box

    if replicate > 1:  # HSDP: FSDP's device_mesh is ("rep", "dp"), sliced from a 3-d mesh
        mesh = init_device_mesh("cpu", (replicate, dp, tp), mesh_dim_names=("rep", "dp", "tp"))
        fsdp_mesh = mesh["rep", "dp"]
    else:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        fsdp_mesh = mesh["dp"]
    mesh_shape = tuple(mesh.mesh.shape)
    p = mesh.get_coordinate()[-2]
    ext = DTensorExtensions()
    dp_pg = mesh["dp"].get_group()
    bad: list[str] = []
    kinds: dict[str, int] = {}
    for i, case in enumerate(cases):
        g = _global(case)
        tp_pl = TReplicate() if case["tp"] == "R" else TShard(int(case["tp"][1:]))
        ours_tp = from_torch(tp_pl)
        truth_l = fsdp_tp_layout(tuple(g.shape), ours_tp, dp=dp, tp_size=tp, replicate=replicate)
        (box,) = truth_l.boxes_of(rank)
        want = g[box.slices()]
        where = f"case {i} {case} rank {rank}"
        try:
            dt = distribute_tensor(g, mesh["tp"], [tp_pl])
            out = ext.chunk_dtensor(dt, p, fsdp_mesh)
            if isinstance(out, DTensor):
                kinds["dtensor"] = kinds.get("dtensor", 0) + 1
                local = out.to_local()
                claimed = placements_layout(
                    tuple(out.shape), mesh_shape, [from_torch(x) for x in out.placements]
                )
                mine = [b for b in claimed.boxes_of(rank) if not b.is_empty]
                if mine != ([box] if not box.is_empty else []):
                    bad.append(f"{where}: placements {out.placements} claim {mine}, data {box}")
            elif isinstance(out, ShardedTensor):
                kinds["sharded_tensor"] = kinds.get("sharded_tensor", 0) + 1
                (sh,) = out.local_shards()
                local = sh.tensor
                if Box(sh.metadata.shard_offsets, sh.metadata.shard_sizes) != box:
                    bad.append(f"{where}: flat shard at {sh.metadata}, data {box}")
                layout_of(out).validate()
            else:
                bad.append(f"{where}: chunk_dtensor returned {type(out).__name__}")
                continue
            if local.dtype != g.dtype or not torch.equal(local, want):
                bad.append(f"{where}: chunk_dtensor local {tuple(local.shape)} is not g{box}")
            back = ext.all_gather_dtensor(out, mesh)  # type: ignore[arg-type]
            if not torch.equal(back, dt.to_local()):
                bad.append(f"{where}: all_gather_dtensor {tuple(back.shape)} is not the TP piece")
            if g.ndim >= 1:
                st = ext.chunk_tensor(dt, p, dp, 1, dp_pg)
                _, shards = ext.pre_load_state_dict_transform(st)
                if len(shards) != 1 or not torch.equal(shards[0].tensor, want):
                    bad.append(f"{where}: pre_load chunk is not g{box}")
                flat = flatten_sharded_tensors({"w": st})["w"]
                (fs,) = flat.local_shards()
                fbox = Box(fs.metadata.shard_offsets, fs.metadata.shard_sizes)
                if fbox != box or not torch.equal(fs.tensor, want):
                    bad.append(f"{where}: flattened local shard {fbox}, but should be {box}")
                for s in layout_of(flat).shards:
                    if s.box not in truth_l.boxes_of(s.rank):
                        bad.append(f"{where}: flat metadata gives {s.box} to rank {s.rank}")
        except Exception as e:
            bad.append(f"{where}: {type(e).__name__}: {e}")
    return {"hooks_random": bad, "facts": {"kinds": kinds, "cases": len(cases)}}


def _fsdp2(model: nn.Module, mesh: Any, tp_mesh: Any = None) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if tp_mesh is not None:
        parallelize_module(model, tp_mesh, tp_plan())
    for i in LINEARS:
        fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(value: Any) -> torch.Tensor:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def resume_world(rank: int, world: int) -> dict[str, Any]:
    """The README's resume-on-another-mesh recipe (FSDP-12): FSDP2 + TP on dp=2 x tp=2 with
    Adam, one step, then `reshard_for` a model on dp=4 (and one on tp=4, and an FSDP1 one on
    dp=4), load, and a second step; every parameter and Adam state equals the plain model's
    after two steps. Then the errors: a shape mismatch raises on every rank, naming the
    parameter, and nothing hangs."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh

    from shardspec.fsdp import reshard_for

    out: dict[str, Any] = {"facts": {}}
    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    # The reference: the plain model, two Adam steps on the same batch.
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    for _ in range(2):
        ref_opt.zero_grad()
        ref(x).sum().backward()
        ref_opt.step()
    names = [k for k, _ in ref.named_parameters()]
    ref_state = {names[i]: s for i, s in enumerate(ref_opt.state.values())}

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    src = _fsdp2(make_model(), mesh["dp"], mesh["tp"])
    src_opt = torch.optim.Adam(src.parameters(), lr=0.1)
    src(x).sum().backward()
    src_opt.step()
    msd = get_model_state_dict(src)
    osd = get_optimizer_state_dict(src, src_opt)

    dp4 = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    tp4 = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    for label, dst in (
        ("dp4", _fsdp2(make_model(seed=5), dp4)),
        ("tp4", _fsdp2(make_model(seed=6), tp4["dp"], tp4["tp"])),
    ):
        opt = torch.optim.Adam(dst.parameters(), lr=0.1)
        new_msd, new_osd = reshard_for(dst, msd, osd)
        assert new_osd is not None
        bad: list[str] = []
        for fqn, states in new_osd["state"].items():
            if states["step"] is osd["state"][fqn]["step"]:
                bad.append(f"{label} {fqn}: step is the source's own object")
        set_model_state_dict(dst, new_msd)
        set_optimizer_state_dict(dst, opt, new_osd)
        opt.zero_grad()
        dst(x).sum().backward()
        opt.step()
        for k, p in dst.named_parameters():
            if not torch.allclose(_full(p), dict(ref.named_parameters())[k], atol=1e-5, rtol=0):
                bad.append(f"{label} {k}: parameter after the second step differs")
            for s in ("exp_avg", "exp_avg_sq"):
                got = _full(opt.state[p][s])
                if not torch.allclose(got, ref_state[k][s], atol=1e-5, rtol=0):
                    bad.append(f"{label} {k}: {s} after the second step differs")
            if float(opt.state[p]["step"]) != 2.0:
                bad.append(f"{label} {k}: step is {float(opt.state[p]['step'])}, not 2")
        out[f"resume_{label}"] = bad
    # An FSDP1 destination (flat parameters, use_orig_params) on dp=4: read back whole.
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    fsdp1 = FSDP(
        make_model(seed=7), device_mesh=dp4, device_id=torch.device("cpu"), use_orig_params=True
    )
    opt = torch.optim.Adam(fsdp1.parameters(), lr=0.1)
    new_msd, new_osd = reshard_for(fsdp1, msd, osd)
    set_model_state_dict(fsdp1, new_msd)
    set_optimizer_state_dict(fsdp1, opt, new_osd)
    opt.zero_grad()
    fsdp1(x).sum().backward()
    opt.step()
    whole = get_model_state_dict(fsdp1, options=StateDictOptions(full_state_dict=True))
    ref_params = dict(ref.named_parameters())
    out["resume_fsdp1_dp4"] = [
        f"fsdp1 {k}: parameter after the second step differs"
        for k, v in whole.items()
        if not torch.allclose(v, ref_params[k], atol=1e-5, rtol=0)
    ] + ([] if sorted(whole) == sorted(ref_params) else [f"fsdp1 keys {sorted(whole)}"])
    # The source's steps were copied, not shared: still 1 after the others took a step.
    out["resume_source_step"] = [
        f"source {fqn}: step advanced to {float(s['step'])}"
        for fqn, s in osd["state"].items()
        if float(s["step"]) != 1.0
    ]
    out["facts"]["resume_states"] = sorted(next(iter(osd["state"].values())))

    # A destination whose first layer is wider: every rank raises naming it, before data moves.
    wrong = make_model()
    wrong[0] = nn.Linear(DIMS[0], DIMS[1] + 1)
    wrong[2] = nn.Linear(DIMS[1] + 1, DIMS[2])
    _fsdp2(wrong, dp4)
    try:
        reshard_for(wrong, msd, osd)
        out["resume_shape_error"] = "no error"
    except Exception as e:
        out["resume_shape_error"] = f"{type(e).__name__}: {e}"
    # One rank's Adam state of another dtype: the error names it as the user knows it
    # ("optimizer state 'exp_avg' of parameter '0.bias'"), once for the ranks that agree.
    from torch.distributed.tensor import DTensor

    spoiled = copy.deepcopy(osd)
    if rank == 1:
        v = spoiled["state"]["0.bias"]["exp_avg"]
        spoiled["state"]["0.bias"]["exp_avg"] = DTensor.from_local(
            v.to_local().double(),
            v.device_mesh,
            v.placements,
            run_check=False,
            shape=v.shape,
            stride=v.stride(),
        )
    try:
        reshard_for(_fsdp2(make_model(seed=8), dp4), msd, spoiled)
        out["facts"]["resume_dtype_error"] = "no error"
    except Exception as e:
        out["facts"]["resume_dtype_error"] = f"{type(e).__name__}: {e}"
    # The group still works: nothing is left half-sent.
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
    out["facts"]["after_error_all_reduce"] = float(t)
    return out
