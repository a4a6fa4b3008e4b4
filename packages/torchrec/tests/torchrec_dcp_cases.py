"""Rank-side functions for test_dcp_torchrec.py: a sharded EmbeddingBagCollection's state dict
saved with DCP under one plan and world size, loaded under another with shardspec's
LoadPlanner, with DCP's default and with ``shardspec.checkpoint.load`` (each read mode).
Expectations: the global weights sliced at the offsets TorchRec reports for each local shard
(the reference), and every loader's bytes the default's."""

from __future__ import annotations

from typing import Any

import torch
import torchrec_cases as cases

from shardspec.reshard.reference import same_bits


def _pieces(sd: dict[str, Any]) -> dict[str, list[tuple[tuple[int, ...], torch.Tensor]]]:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: dict[str, list[tuple[tuple[int, ...], torch.Tensor]]] = {}
    for k, v in sd.items():
        if isinstance(v, ShardedTensor):
            out[k] = [(tuple(s.metadata.shard_offsets), s.tensor) for s in v.local_shards()]
        else:
            out[k] = [((0,) * v.ndim, v)]
    return out


def save_ebc(rank: int, world: int, path: str, spec: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp

    from shardspec.checkpoint.dcp import SavePlanner

    module = cases.shard_with(spec)
    cases.fill(module, cases.global_weights(0))
    dcp.save(module.state_dict(), checkpoint_id=path, planner=SavePlanner())


def load_ebc(rank: int, world: int, path: str, spec: dict[str, Any]) -> list[str]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from shardspec.checkpoint import load
    from shardspec.checkpoint.dcp import LoadPlanner

    want = cases.global_weights(0)
    bad: list[str] = []
    got: dict[str, Any] = {}
    loaders = [("ours", LoadPlanner()), ("default", DefaultLoadPlanner()),
               ("load-own", None), ("load-once", None)]  # fmt: skip
    for name, planner in loaders:
        module = cases.shard_with(spec)
        cases.fill(module, cases.global_weights(7))  # other values: the load must overwrite
        sd = module.state_dict()
        if planner is None:  # shardspec.checkpoint.load, the collective load (CKPT-23)
            load(sd, path, reads=name.removeprefix("load-"))
        else:
            dcp.load(sd, checkpoint_id=path, planner=planner)
        got[name] = _pieces(sd)
        for k, pieces in got[name].items():
            for off, t in pieces:
                ref = want[k][tuple(slice(o, o + n) for o, n in zip(off, t.shape))]
                if not same_bits(t, ref):
                    bad.append(f"rank {rank} {k} at {off} ({name}): loaded values differ")
    for name in ("ours", "load-own", "load-once"):
        for k, pieces in got[name].items():
            theirs = got["default"][k]
            if len(pieces) != len(theirs) or not all(
                a[0] == b[0] and same_bits(a[1], b[1]) for a, b in zip(pieces, theirs)
            ):
                bad.append(f"rank {rank} {k}: {name} loaded other bytes than the default")
    if set(got["ours"]) != {cases.key(t) for t in cases.TABLES}:
        bad.append(f"rank {rank}: state dict keys {sorted(got['ours'])}")
    return bad
