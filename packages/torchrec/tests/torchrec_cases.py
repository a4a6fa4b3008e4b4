"""Rank-side checks for the TorchRec model tests: run inside the ranks of a
shardspec.testing.RankPool (as rank functions).

Each function returns a list of failure messages (empty when everything held) so that the
driver asserts once with every rank's findings; exceptions travel back as RankError.
The expectations come from the unsharded module and the global weights (reference slices),
never from shardspec's own output.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

TABLES = {"t0": (11, 8), "t1": (7, 16), "t2": (5, 8)}  # rows divide by neither 2 nor 4


def key(table: str) -> str:
    return f"embedding_bags.{table}.weight"


def global_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {key(t): torch.randn(shape, generator=g) for t, shape in TABLES.items()}


def _configs() -> list[Any]:
    from torchrec import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(name=t, embedding_dim=c, num_embeddings=r, feature_names=[f"f_{t}"])
        for t, (r, c) in TABLES.items()
    ]


def unsharded(weights: dict[str, torch.Tensor]) -> Any:
    from torchrec import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=_configs(), device=torch.device("cpu"))
    ebc.load_state_dict(weights)
    return ebc


def batch(seed: int) -> Any:
    """A KeyedJaggedTensor of 4 bags per feature, empty bags included."""
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for rows, _ in TABLES.values():
        ls = torch.randint(0, 4, (4,), generator=g)
        lengths.append(ls)
        values.append(torch.randint(0, rows, (int(ls.sum()),), generator=g))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{t}" for t in TABLES], values=torch.cat(values), lengths=torch.cat(lengths)
    )


def layouts_of(spec: dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]]) -> dict[str, Any]:
    from shardspec.torchrec import layout_for

    return {t: layout_for(stype, TABLES[t], *args, **kw) for t, (stype, args, kw) in spec.items()}


def module_plan(spec: dict[str, Any]) -> Any:
    """TorchRec's EmbeddingModuleShardingPlan placing our layouts of ``spec``."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    from shardspec.torchrec import to_parameter_sharding

    layouts = layouts_of(spec)
    return EmbeddingModuleShardingPlan(
        {t: to_parameter_sharding(layouts[t], spec[t][0]) for t in spec}
    )


def shard_with(spec: dict[str, Any], *, output_dtensor: bool = False) -> Any:
    """A meta-device EBC sharded by an explicit plan built from our layouts."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard
    from torchrec.distributed.types import ShardingEnv

    plan = module_plan(spec)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    env.output_dtensor = output_dtensor
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    )
    ebc = EmbeddingBagCollection(tables=_configs(), device=torch.device("meta"))
    return shard(ebc, plan, env, torch.device("cpu"), sharder)


def torchrec_local_pieces(module: Any) -> dict[str, list[tuple[tuple[int, ...], torch.Tensor]]]:
    """Each table's local tensors with the offsets TorchRec itself reports for them."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    out: dict[str, list[tuple[tuple[int, ...], torch.Tensor]]] = {}
    for k, v in module.state_dict().items():
        if isinstance(v, ShardedTensor):
            out[k] = [(tuple(s.metadata.shard_offsets), s.tensor) for s in v.local_shards()]
        elif isinstance(v, DTensor):
            w = v._local_tensor
            out[k] = [(tuple(o), t) for o, t in zip(w.local_offsets(), w.local_shards())]
        else:
            out[k] = [((0,) * v.ndim, v)]
    return out


def fill(module: Any, weights: dict[str, torch.Tensor]) -> None:
    """Write the global weights into the sharded model at TorchRec's own offsets."""
    with torch.no_grad():
        for k, pieces in torchrec_local_pieces(module).items():
            for off, t in pieces:
                t.copy_(weights[k][tuple(slice(o, o + n) for o, n in zip(off, t.shape))])


def pooled(module: Any, kjt: Any) -> dict[str, torch.Tensor]:
    out = module(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    return {k: v.detach().clone() for k, v in out.to_dict().items()}


def _compare_forward(
    module: Any, weights: dict[str, torch.Tensor], rank: int, tag: str
) -> list[str]:
    kjt = batch(100 + rank)
    got = pooled(module, kjt)
    want = pooled(unsharded(weights), kjt)
    bad = []
    for f, w in want.items():
        if not torch.allclose(got[f], w, rtol=1e-5, atol=1e-5):
            err = (got[f] - w).abs().max().item()
            bad.append(f"{tag}: rank {rank} pooled {f} differs from the unsharded module by {err}")
    return bad


def _compare_shards(
    module: Any, layouts: dict[str, Any], weights: dict[str, torch.Tensor], rank: int, tag: str
) -> list[str]:
    """Every local shard equals the reference slice of its box in our layout."""
    from shardspec.torchrec.model import read_state

    bad = []
    states = read_state(module, keys=[key(t) for t in layouts])
    for t, layout in layouts.items():
        st = states[key(t)]
        if st.layout != layout:
            bad.append(f"{tag}: {t} is laid out as {st.layout}, our layout says {layout}")
            continue
        boxes = layout.boxes_of(rank)
        if len(boxes) != len(st.shards):
            bad.append(f"{tag}: {t} rank {rank} has {len(st.shards)} shards for {boxes}")
            continue
        for b, s in zip(boxes, st.shards):
            if not torch.equal(s, weights[key(t)][b.slices()]):
                bad.append(f"{tag}: {t} rank {rank} shard {b} is not the reference slice")
    return bad


def check_plans(rank: int, world: int, specs: dict[str, Any], output_dtensor: bool) -> list[str]:
    """Each plan: TorchRec's layout is ours, local shards are reference slices, forward is right."""
    weights = global_weights()
    bad: list[str] = []
    for name, spec in specs.items():
        m = shard_with(spec, output_dtensor=output_dtensor)
        fill(m, weights)
        bad += _compare_shards(m, layouts_of(spec), weights, rank, name)
        bad += _compare_forward(m, weights, rank, name)
    return bad


def check_pairs(rank: int, world: int, pairs: list[Any]) -> list[str]:
    """Reshard a filled model into a model sharded by another plan, in memory, and check it."""
    from shardspec.torchrec.model import reshard_model

    weights = global_weights(1)
    bad: list[str] = []
    for name, src_spec, dst_spec, src_dt, dst_dt in pairs:
        src = shard_with(src_spec, output_dtensor=src_dt)
        fill(src, weights)
        dst = shard_with(dst_spec, output_dtensor=dst_dt)
        with torch.no_grad():  # start the destination from garbage that cannot pass by luck
            for pieces in torchrec_local_pieces(dst).values():
                for _, t in pieces:
                    t.fill_(float("nan"))
        moved = reshard_model(src, dst)
        dst_layouts = layouts_of(dst_spec)
        for t, layout in dst_layouts.items():
            if moved[key(t)][1] != layout:
                bad.append(f"{name}: reshard_model targeted {moved[key(t)][1]} for {t}")
        bad += _compare_shards(dst, dst_layouts, weights, rank, name)
        bad += _compare_forward(dst, weights, rank, name)
    return bad


def check_refusal(rank: int, world: int, src_spec: Any, dst_spec: Any) -> list[str]:
    """Loading shards laid out for one plan into a model of another must fail everywhere, and
    so must a reshard between models that hold different tables."""
    from shardspec.reshard import ReshardError
    from shardspec.torchrec.model import load_state, read_state, reshard_states

    src = shard_with(src_spec)
    dst = shard_with(dst_spec)
    before = {k: [t.clone() for t in v.shards] for k, v in read_state(dst).items()}
    messages = []
    try:
        load_state(dst, read_state(src))
        messages.append("no error")
    except ReshardError as e:
        messages.append(str(e))
    after = read_state(dst)
    untouched = all(torch.equal(a, b) for k in before for a, b in zip(before[k], after[k].shards))
    messages.append(f"untouched={untouched}")
    # Same layouts load fine: the round trip through reshard_states to dst's own layouts.
    states = read_state(src)
    moved = reshard_states(states, {k: v.layout for k, v in read_state(dst).items()})
    load_state(dst, moved)
    weights_ok = all(
        torch.equal(a, b)
        for k in moved
        for a, b in zip(moved[k].shards, read_state(dst, keys=[k])[k].shards)
    )
    messages.append(f"loaded={weights_ok}")
    try:
        bad = dict(states)
        bad.pop(key("t0"))
        reshard_states(bad, {k: v.layout for k, v in read_state(dst).items()})
        messages.append("no error")
    except ReshardError as e:
        messages.append(str(e))
    return messages


def dtensor_truth(rank: int, world: int, specs: dict[str, Any]) -> dict[str, tuple[bool, bool]]:
    """Per plan and table: (gathered wrapper layout == ours, placements' claim == ours)."""
    from torch.distributed.tensor import DTensor

    from shardspec.torchrec.dtensor import claimed_layout, gather_layout

    out = {}
    for name, spec in specs.items():
        m = shard_with(spec, output_dtensor=True)
        sd = m.state_dict()
        for t, layout in layouts_of(spec).items():
            if not isinstance(sd[key(t)], DTensor):
                continue  # data_parallel tables stay plain tensors
            truth = gather_layout(sd[key(t)])
            try:
                claim_ok = claimed_layout(sd[key(t)]) == layout
            except ValueError:
                claim_ok = False
            out[f"{name}.{t}"] = (truth == layout, claim_ok)
    return out


# --- the wrapper through DCP on several ranks (no TorchRec needed) --------------------------


def wrapper_dcp_round_trip(
    rank: int, world: int, cases: list[tuple[Any, Any, str]], seed: int, root: str
) -> list[str]:
    """Save each src layout's wrappers with DCP under ``root``, load them into dst layout's
    wrappers, compare with the reference slices."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate

    from shardspec.torchrec.dtensor import to_dtensor

    # DCP checks a state-dict value's size() against the saved global size, so a wrapper that
    # holds part of the tensor travels inside a DTensor; the placements are only a claim
    # (TORCHREC-15), the wrapper's offsets say what this rank holds.
    mesh = DeviceMesh("cpu", list(range(world)))
    bad = []
    for i, (src, dst, dtype_name) in enumerate(cases):
        from torchrec_strategies import make_global

        full = make_global(src.shape, dtype_name, seed + i)
        path = f"{root}/case{i}"

        def wrap(layout: Any, data: torch.Tensor | None, dtype: torch.dtype) -> Any:
            shards = [
                data[b.slices()] if data is not None else torch.zeros(b.sizes, dtype=dtype)
                for b in layout.boxes_of(rank)
            ]
            return to_dtensor(layout, shards, mesh, rank, placements=[Replicate()])

        dcp.save({"t": wrap(src, full, full.dtype)}, checkpoint_id=path)
        target = wrap(dst, None, full.dtype)
        dcp.load({"t": target}, checkpoint_id=path)
        for b, t in zip(dst.boxes_of(rank), target._local_tensor.local_shards()):
            if not torch.equal(t, full[b.slices()]):
                bad.append(f"case {i} ({src} -> {dst}, {dtype_name}): rank {rank} box {b} wrong")
        dist.barrier()
    return bad


def _kernel_storages(module: Any) -> set[int]:
    """Storages of the model's own parameters and buffers (the fused kernel's weights)."""
    import itertools

    ptrs = set()
    for t in itertools.chain(module.parameters(), module.buffers()):
        try:
            ptrs.add(t.untyped_storage().data_ptr())
        except Exception:  # ShardedTensor / DTensor parameters have no storage of their own
            continue
    return ptrs


def _spy(real: Any, calls: list[dict[str, Any]], bad: list[str], tag: str) -> Any:
    """``real`` (reshard_state_dict), recording its keyword arguments and checking that with
    ``out`` it returns the very tensors it was given."""

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        result = real(*args, **kwargs)
        out = kwargs.get("out")
        for k in out or {}:
            if any(r is not o for r, o in zip(result[k], out[k], strict=True)):
                bad.append(f"{tag}: {k} result is not the out tensors")
        return result

    return spy


def check_in_place(rank: int, world: int, pairs: list[Any]) -> list[str]:
    """reshard_model hands the destination's own weight tensors to the executor as ``out`` and
    the model's storage is what changes; a reshard of a model into itself (sources and
    destinations overlap) falls back to receiving into new tensors, with the same result."""
    from unittest import mock

    import shardspec.torchrec.model as model

    weights = global_weights(2)
    bad: list[str] = []
    for name, src_spec, dst_spec, src_dt, dst_dt in pairs:
        src = shard_with(src_spec, output_dtensor=src_dt)
        fill(src, weights)
        dst = shard_with(dst_spec, output_dtensor=dst_dt)
        with torch.no_grad():
            for pieces in torchrec_local_pieces(dst).values():
                for _, t in pieces:
                    t.fill_(float("nan"))
        kernel = _kernel_storages(dst)
        before = {k: [t.data_ptr() for _, t in v] for k, v in torchrec_local_pieces(dst).items()}
        calls: list[dict[str, Any]] = []
        spy = _spy(model.reshard_state_dict, calls, bad, f"{name}: rank {rank}")
        with mock.patch.object(model, "reshard_state_dict", spy):
            model.reshard_model(src, dst)
        outs = [c["out"] for c in calls if c.get("out") is not None]
        if len(calls) != 1 or len(outs) != 1 or set(outs[0]) != set(before):
            bad.append(f"{name}: rank {rank} expected one call with out= for every table: {calls}")
            continue
        for k, tensors in outs[0].items():
            mine = zip(before[k], torchrec_local_pieces(dst)[k])
            if sorted(t.data_ptr() for t in tensors if t.numel()) != sorted(
                p for p, (_, t) in mine if t.numel()
            ):
                bad.append(f"{name}: rank {rank} out for {k} is not the model's tensors")
            if any(t.untyped_storage().data_ptr() not in kernel for t in tensors if t.numel()):
                bad.append(f"{name}: rank {rank} out for {k} is not the model's storage")
        after = {k: [t.data_ptr() for _, t in v] for k, v in torchrec_local_pieces(dst).items()}
        if after != before:
            bad.append(f"{name}: rank {rank} the destination's weights moved: {before} {after}")
        bad += _compare_shards(dst, layouts_of(dst_spec), weights, rank, name)
        bad += _compare_forward(dst, weights, rank, name)
        # Into itself: every destination tensor is a source tensor, so no table goes in place.
        calls.clear()
        with mock.patch.object(model, "reshard_state_dict", spy):
            model.reshard_model(dst, dst)
        if [c.get("out") for c in calls] != [None]:
            bad.append(f"{name}: rank {rank} a self-reshard wrote into its own inputs: {calls}")
        bad += _compare_shards(dst, layouts_of(dst_spec), weights, rank, f"{name} (self)")
        bad += _compare_forward(dst, weights, rank, f"{name} (self)")
    return bad


def check_plan_keys_round_trip(rank: int, world: int, src_spec: Any, dst_spec: Any) -> list[str]:
    """``layouts_from_plan`` fed with ``read_state``'s shapes (state-dict keys) and with table
    names: both reshard a model's state into the other plan's model (TORCHREC-19)."""
    from torchrec.distributed.types import ShardingPlan

    from shardspec.torchrec import layouts_from_plan
    from shardspec.torchrec.model import load_state, read_state, reshard_states

    weights = global_weights(2)
    src = shard_with(src_spec)
    fill(src, weights)
    states = read_state(src)
    plan = ShardingPlan({"": module_plan(dst_spec)})
    by_key = layouts_from_plan(plan, {k: s.layout.shape for k, s in states.items()})
    by_name = layouts_from_plan(plan, {t: TABLES[t] for t in dst_spec})
    bad: list[str] = []
    if sorted(by_key) != sorted(key(t) for t in dst_spec) or sorted(by_name) != sorted(dst_spec):
        bad.append(f"keys: {sorted(by_key)} from read_state's shapes, {sorted(by_name)} by name")
    for tag, layouts in (("state-dict keys", by_key), ("table names", by_name)):
        dst = shard_with(dst_spec)
        load_state(dst, reshard_states(states, layouts))
        bad += _compare_shards(dst, layouts_of(dst_spec), weights, rank, f"{tag}")
        mine = read_state(dst, keys=[f"{t}" for t in dst_spec])
        if sorted(mine) != sorted(key(t) for t in dst_spec):
            bad.append(f"{tag}: read_state by table name gave {sorted(mine)}")
    return bad
