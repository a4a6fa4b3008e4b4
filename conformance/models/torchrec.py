"""Real TorchRec models resharded between plans on fresh gloo ranks (TORCHREC-17).

A world function builds a ``DistributedModelParallel`` around an EmbeddingBagCollection of
three uneven tables, sharded by an explicit source plan and filled with known global weights,
then moves it to the destination plan with the implementation under test:

- ``shardspec``: :func:`shardspec.torchrec.reshard_model` into a second DMP built with the
  destination plan;
- ``torch``: TorchRec's own ``DistributedModelParallel.reshard`` in place (table_wise and
  column_wise only: the types its dynamic sharding moves).

Every rank then checks, against the global weights (the reference), that its tables are laid
out as the destination layout says, that each local piece at TorchRec's own offsets is the
reference slice, and that the model pools like the unsharded module. Returns the list of
problems (empty when everything held).
"""

from __future__ import annotations

from typing import Any

TABLES = {"t0": (11, 8), "t1": (7, 16), "t2": (5, 8)}  # rows divide by neither 2 nor 4

# name -> (source plan, destination plan); a plan maps each table to (type, args). Every table
# or column block changes rank: gloo has no send to self, so a block that stays would test
# gloo, not the move.
PAIRS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "table_wise": (
        {"t0": ["table_wise", [1]], "t1": ["table_wise", [0]], "t2": ["table_wise", [1]]},
        {"t0": ["table_wise", [0]], "t1": ["table_wise", [1]], "t2": ["table_wise", [0]]},
    ),
    "column_wise, one block per rank": (
        {
            "t0": ["column_wise", [[0, 1]]],
            "t1": ["column_wise", [[1, 0]]],
            "t2": ["column_wise", [[1]]],
        },
        {
            "t0": ["column_wise", [[1, 0]]],
            "t1": ["column_wise", [[0, 1]]],
            "t2": ["column_wise", [[0]]],
        },
    ),
    # TorchRec's dynamic sharding moves table_wise and column_wise tables only (torchrec#2534)
    "row_wise to table_wise": (
        {"t0": ["row_wise", [2]], "t1": ["table_wise", [0]], "t2": ["table_wise", [1]]},
        {"t0": ["table_wise", [1]], "t1": ["table_wise", [1]], "t2": ["table_wise", [0]]},
    ),
    "column_wise, two blocks on a rank": (
        {
            "t0": ["table_wise", [0]],
            "t1": ["column_wise", [[1, 0, 1, 0]]],
            "t2": ["table_wise", [0]],
        },
        {
            "t0": ["table_wise", [0]],
            "t1": ["column_wise", [[0, 1, 0, 1]]],
            "t2": ["table_wise", [0]],
        },
    ),
}


def key(table: str) -> str:
    return f"embedding_bags.{table}.weight"


def _weights() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(7)
    return {key(t): torch.randn(shape, generator=g) for t, shape in TABLES.items()}


def _configs() -> list[Any]:
    from torchrec import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(name=t, embedding_dim=c, num_embeddings=r, feature_names=[f"f_{t}"])
        for t, (r, c) in TABLES.items()
    ]


def layouts(plan: dict[str, Any]) -> dict[str, Any]:
    from shardspec.torchrec import layout_for

    return {t: layout_for(stype, TABLES[t], *args) for t, (stype, args) in plan.items()}


def _module_plan(plan: dict[str, Any]) -> Any:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    from shardspec.torchrec import to_parameter_sharding

    lays = layouts(plan)
    return EmbeddingModuleShardingPlan(
        {t: to_parameter_sharding(lays[t], plan[t][0]) for t in plan}
    )


def _dmp(plan: dict[str, Any]) -> tuple[Any, Any]:
    """(DMP, its sharded EBC): a dense layer beside the tables, so DMP wraps it in DDP as a
    training job does (TorchRec's reshard reaches the DDP wrapper's ``.module``)."""
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense = torch.nn.Linear(2, 2)
            self.ebc = EmbeddingBagCollection(tables=_configs(), device=torch.device("meta"))

    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    )
    dmp = DistributedModelParallel(
        Model(),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=ShardingPlan({"ebc": _module_plan(plan)}),
        sharders=[sharder],
    )
    return dmp, _ebc(dmp)


def _ebc(dmp: Any) -> Any:
    inner = dmp.module
    return (inner.module if hasattr(inner, "module") else inner).ebc


def _pieces(ebc: Any) -> dict[str, list[tuple[tuple[int, ...], Any]]]:
    """Each table's local tensors at the offsets TorchRec itself states for them."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: dict[str, list[tuple[tuple[int, ...], Any]]] = {}
    for k, v in ebc.state_dict().items():
        if isinstance(v, ShardedTensor):
            out[k] = [(tuple(s.metadata.shard_offsets), s.tensor) for s in v.local_shards()]
    return out


def _fill(ebc: Any, weights: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for k, pieces in _pieces(ebc).items():
            for off, t in pieces:
                t.copy_(weights[k][tuple(slice(o, o + n) for o, n in zip(off, t.shape))])


def _poison(ebc: Any) -> None:
    import torch

    with torch.no_grad():  # a destination that cannot pass by luck
        for pieces in _pieces(ebc).values():
            for _, t in pieces:
                t.fill_(float("nan"))


def _batch(seed: int) -> Any:
    import torch
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


def _pooled(module: Any, kjt: Any) -> dict[str, Any]:
    out = module(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    return {k: v.detach().clone() for k, v in out.to_dict().items()}


def check_against_reference(
    ebc: Any, dst: dict[str, Any], weights: dict[str, Any], rank: int, tag: str
) -> list[str]:
    """The destination layout's boxes, each holding its reference slice, and the pooled
    output of the unsharded module."""
    import torch
    from torchrec import EmbeddingBagCollection

    bad = []
    pieces = _pieces(ebc)
    for t, layout in layouts(dst).items():
        got = sorted((off, tuple(x.shape)) for off, x in pieces.get(key(t), []))
        want = sorted((tuple(b.offsets), tuple(b.sizes)) for b in layout.boxes_of(rank))
        if got != want:
            bad.append(f"{tag}: rank {rank} holds {t} pieces {got}, the plan says {want}")
            continue
        for off, x in pieces[key(t)]:
            ref = weights[key(t)][tuple(slice(o, o + n) for o, n in zip(off, x.shape))]
            if not torch.equal(x, ref):
                wrong = int((x != ref).sum())
                bad.append(
                    f"{tag}: rank {rank} {t} piece at {off} of shape {tuple(x.shape)} differs "
                    f"from the reference slice in {wrong} element(s)"
                )
    plain = EmbeddingBagCollection(tables=_configs(), device=torch.device("cpu"))
    plain.load_state_dict(weights)
    kjt = _batch(100 + rank)
    want_out, got_out = _pooled(plain, kjt), _pooled(ebc, kjt)
    for f, w in want_out.items():
        if not torch.allclose(got_out[f], w, rtol=1e-5, atol=1e-5):
            err = (got_out[f] - w).abs().nan_to_num(float("inf")).max().item()
            bad.append(f"{tag}: rank {rank} pooled {f} differs from the unsharded module by {err}")
    return bad


# What ``prepare`` built on this rank, for ``move_and_check`` (the ranks live on between calls).
_BUILT: list[tuple[str, Any, Any, Any]] = []


def prepare(rank: int, world: int, via: str, names: list[str]) -> int:
    """Build and fill the source model of each named pair of :data:`PAIRS` (and for
    shardspec the destination model); return how many pairs are ready."""
    _BUILT.clear()
    weights = _weights()
    for name in names:
        src, dst = PAIRS[name]
        dmp, ebc = _dmp(src)
        _fill(ebc, weights)
        target = None
        if via != "torch":
            _, target = _dmp(dst)
            _poison(target)
        _BUILT.append((name, dmp, ebc, target))
    return len(_BUILT)


def move_and_check(rank: int, world: int, via: str) -> list[str]:
    """Move every prepared model to its destination plan with ``via``; return problems."""
    weights = _weights()
    bad: list[str] = []
    for name, dmp, ebc, target in _BUILT:
        src, dst = PAIRS[name]
        if via == "torch":
            from torchrec.distributed.sharding.dynamic_sharding import (
                output_sharding_plan_delta_single,
            )

            delta = output_sharding_plan_delta_single(_module_plan(src), _module_plan(dst), True)
            dmp.reshard({"ebc": delta}, "ebc")
            out = _ebc(dmp)
        else:
            from shardspec.torchrec import reshard_model

            reshard_model(ebc, target)
            out = target
        bad += check_against_reference(out, dst, weights, rank, name)
    _BUILT.clear()
    return bad
