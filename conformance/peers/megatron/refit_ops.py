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

__all__ = ["MegatronRefit", "metadata", "module"]


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


class MegatronRefit:
    """One rank's side of a Megatron refit, set up as ``build_local_reshard_plan`` sets it up:
    its source and destination models from ``mine`` (its entry of ``rosters.rosters``) and
    its source boxes ``state`` by name, the metadata all-gathered over ``group``, the plan
    built once. :meth:`run` executes it; :meth:`load` puts new source values in place;
    :meth:`result` is the rank's destination boxes, each local tensor split into its parts."""

    def __init__(
        self,
        mine: dict[str, list[dict[str, Any]]],
        state: dict[str, list[torch.Tensor]],
        rank: int,
        world: int,
        group: Any = None,
    ) -> None:
        import torch.distributed as dist
        from megatron.core.resharding import (  # type: ignore[import-not-found]
            build_plan_from_rosters,
            index_metadata_rosters,
        )
        from megatron.core.resharding.copy_services.gloo_copy_service import (  # type: ignore[import-not-found]
            GlooCopyService,
        )

        megatron_cpu_patch()
        self.mine, self.group = mine, group
        # a source feeding two targets: one tensor
        self.src_meta = {m["name"]: m for m in mine["src"]}
        src = {n: _local(m, state[n]) for n, m in self.src_meta.items()}
        dst = {m["name"]: torch.zeros(m["shape"], dtype=getattr(torch, m["dtype"]))
               for m in mine["dst"]}  # fmt: skip
        self.src_module = module(src) if src else None
        self.dst_module = module(dst) if dst else None
        pair = tuple([metadata(m, rank, world) for m in mine[side]] for side in ("src", "dst"))
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, pair, group=group)
        self.plan = build_plan_from_rosters(*index_metadata_rosters(gathered), rank)
        self.service = GlooCopyService(group=group)
        self.sources = dict(self.src_module.named_parameters()) if src else {}
        self.params = dict(self.dst_module.named_parameters()) if dst else {}

    def load(self, state: dict[str, list[torch.Tensor]]) -> None:
        with torch.no_grad():
            for n, m in self.src_meta.items():
                self.sources[n].copy_(_local(m, state[n]))

    def run(self) -> None:
        from megatron.core.resharding import execute_reshard_plan  # type: ignore[import-not-found]

        execute_reshard_plan(
            self.plan, self.src_module, self.dst_module, self.service, group=self.group
        )

    def result(self) -> list[torch.Tensor]:
        got: list[torch.Tensor] = []
        for m in self.mine["dst"]:
            t = self.params[m["name"]].detach()
            got += list(t.split(m["pieces"], m["split_dim"])) if len(m["pieces"]) > 1 else [t]
        return got


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
    counts: dict[str, int] = args["boxes"][ctx.rank]
    rounds, pos = [], 0
    for _ in range(args["rounds"]):
        state = {}
        for n, k in counts.items():
            state[n] = ts[pos : pos + k]
            pos += k
        rounds.append(state)
    refit = MegatronRefit(args["metadata"][ctx.rank], rounds[0], ctx.rank, ctx.world, ctx.group)
    got: list[torch.Tensor] = []
    for i, state in enumerate(rounds):
        if i:
            refit.load(state)
        refit.run()
        got += [t.clone() for t in refit.result()]
    return {"sends": len(refit.plan.send_ops), "recvs": len(refit.plan.recv_ops)}, got
