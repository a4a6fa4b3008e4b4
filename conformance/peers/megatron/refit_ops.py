"""The Megatron-Core peer's refit operation (``conformance/peers/megatron/adapter.py``): a real
``megatron.core.resharding`` refit on the pool's ranks, as ``build_local_reshard_plan`` and
``execute_reshard_plan`` do it, with the gloo copy service. Registered in
``shardspec.testing.ops``'s table when a pool imports this module (only while megatron is the
implementation under test).

Each rank builds its own ``ParameterMetadata`` from ``args["metadata"][rank]`` (what
``extract_param_metadata`` reads off a Megatron parameter: ``rosters.py`` derives it from the
case's layouts), all-gathers them as ``build_local_reshard_plan`` does, indexes them with
``index_metadata_rosters`` and plans with ``build_plan_from_rosters``. The source and
destination models are ``torch.nn.Module`` trees whose parameters carry those names: a rank's
local tensor of a parameter is its boxes of it concatenated along ``partition_dim`` (one box
unless the parameter packs parts). The plan is built once and executed once per round, the
sources changed in place in between (as Megatron's ``swap_model_weights`` reuses its plan).

Without CUDA, ``shardspec.testing.peers.megatron_cpu_patch`` answers the CUDA calls of the
resharding's ``execution`` and gloo copy service (named in the report's header).
"""

from __future__ import annotations

from typing import Any

import torch

from shardspec.testing.ops import Context, operation
from shardspec.testing.peers import megatron_cpu_patch

__all__ = ["metadata", "module"]


def module(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module tree whose ``named_parameters()`` are ``tensors`` by their dotted names."""
    root = torch.nn.Module()
    for name, t in tensors.items():
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        m.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


def metadata(m: dict[str, Any], owner: int, world: int) -> Any:
    """Megatron's ``ParameterMetadata`` of ``m`` (an entry of ``rosters.rosters``) on rank
    ``owner`` of ``world`` (one pipeline stage: every rank)."""
    from megatron.core.resharding import ParameterMetadata  # type: ignore[import-not-found]

    dtype = getattr(torch, m["dtype"])
    return ParameterMetadata(
        name=m["name"],
        shape=tuple(m["shape"]),
        dtype=dtype,
        element_size=torch.empty((), dtype=dtype).element_size(),
        is_tp=m["is_tp"],
        partition_dim=m["partition_dim"],
        partition_stride=1,
        partition_sizes=m["partition_sizes"],
        owner_rank=owner,
        tensor_parallel_group_ranks=m["tp"],
        data_parallel_group_ranks=m["dp"],
        pipeline_parallel_group_ranks=list(range(world)),
        resolved_name=m["resolved_name"],
    )


def _local(m: dict[str, Any], boxes: list[torch.Tensor]) -> torch.Tensor:
    """A rank's local tensor of a parameter: its boxes, concatenated along the split dim."""
    if len(boxes) == 1:
        return boxes[0].clone()
    return torch.cat(boxes, dim=m["split_dim"])


def _check(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    need = args["rounds"] * sum(args["boxes"][ctx.rank].values())
    if len(ts) != need:
        raise ValueError(f"rank {ctx.rank} got {len(ts)} tensors for {need} source boxes")


@operation("megatron.refit", collective=True, check=_check)
def _refit(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """Megatron's refit of ``args["metadata"]``, once per round; per round this rank's
    destination boxes in ``args["metadata"][rank]["dst"]`` order (each parameter's local
    tensor split back into its parts)."""
    import torch.distributed as dist
    from megatron.core.resharding import (  # type: ignore[import-not-found]
        build_plan_from_rosters,
        execute_reshard_plan,
        index_metadata_rosters,
    )
    from megatron.core.resharding.copy_services.gloo_copy_service import (  # type: ignore[import-not-found]
        GlooCopyService,
    )

    megatron_cpu_patch()
    mine = args["metadata"][ctx.rank]
    counts: dict[str, int] = args["boxes"][ctx.rank]
    rounds, pos = [], 0
    for _ in range(args["rounds"]):
        state = {}
        for n, k in counts.items():
            state[n] = ts[pos : pos + k]
            pos += k
        rounds.append(state)
    src_meta = {m["name"]: m for m in mine["src"]}  # a source feeding two targets: one tensor
    src = {n: _local(m, rounds[0][n]) for n, m in src_meta.items()}
    dst = {
        m["name"]: torch.zeros(m["shape"], dtype=getattr(torch, m["dtype"])) for m in mine["dst"]
    }
    src_module = module(src) if src else None
    dst_module = module(dst) if dst else None
    pair = tuple([metadata(m, ctx.rank, ctx.world) for m in mine[side]] for side in ("src", "dst"))
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, pair, group=ctx.group)
    plan = build_plan_from_rosters(*index_metadata_rosters(gathered), ctx.rank)
    service = GlooCopyService(group=ctx.group)
    params = dict(dst_module.named_parameters()) if dst_module is not None else {}
    sources = dict(src_module.named_parameters()) if src_module is not None else {}
    got: list[torch.Tensor] = []
    for i, state in enumerate(rounds):
        if i:
            with torch.no_grad():
                for n, m in src_meta.items():
                    sources[n].copy_(_local(m, state[n]))
        execute_reshard_plan(plan, src_module, dst_module, service, group=ctx.group)
        for m in mine["dst"]:
            t = params[m["name"]].detach()
            if len(m["pieces"]) > 1:
                got += [p.clone() for p in t.split(m["pieces"], m["split_dim"])]
            else:
                got.append(t.clone())
    return {"sends": len(plan.send_ops), "recvs": len(plan.recv_ops)}, got
