"""The world functions transformers' ranks run (``shardspec.testing.run_world``): a Llama-style
model directory written from given weights, loaded with ``from_pretrained(...,
distributed_config=DistributedConfig(tp_size, fsdp_size))`` on CPU gloo ranks, saved with
``save_pretrained`` and loaded again. Imported only in the venv ``nox -s peers_transformers``
builds."""

from __future__ import annotations

import os
from typing import Any

import torch

from conformance.codec import placements_to_json


def write_model(path: str, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """The model directory transformers reads: ``config.json`` and one safetensors file."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    LlamaConfig(**config).save_pretrained(path)
    tensors = {k: v.contiguous() for k, v in weights.items()}
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def _load(path: str, tp: int, fsdp: int) -> Any:
    from transformers import LlamaForCausalLM
    from transformers.distributed import DistributedConfig

    config = DistributedConfig(tp_size=tp, fsdp_size=fsdp)
    return LlamaForCausalLM.from_pretrained(path, distributed_config=config, dtype=torch.float32)


def _shards(model: Any) -> dict[str, dict[str, Any]]:
    from torch.distributed.tensor import DTensor

    out: dict[str, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            mesh = p.device_mesh
            out[name] = {
                "mesh": list(mesh.shape),
                "coordinate": list(mesh.get_coordinate() or []),
                "placements": placements_to_json(p.placements),
                "local": p.to_local().detach().clone(),
            }
        else:
            out[name] = {
                "mesh": [],
                "coordinate": [],
                "placements": [],
                "local": p.detach().clone(),
            }
    return out


def load_world(rank: int, world: int, path: str, tp: int, fsdp: int) -> dict[str, Any]:
    """``from_pretrained`` of ``path`` on a (fsdp, tp) mesh: each parameter's shard."""
    return _shards(_load(path, tp, fsdp))


def save_world(
    rank: int, world: int, path: str, tp: int, fsdp: int, fmt: str, out: str
) -> dict[str, Any]:
    """As :func:`load_world`, then ``save_pretrained(out)``: its distributed checkpoint
    (``fmt`` "dcp") or its consolidated safetensors (``fmt`` "safetensors")."""
    model = _load(path, tp, fsdp)
    model.save_pretrained(out, distributed_checkpoint=fmt == "dcp")
    return _shards(model)


def shardspec_load_world(
    rank: int, world: int, path: str, tp: int, fsdp: int, saved: str
) -> dict[str, Any]:
    """``from_pretrained`` of ``path`` on a (fsdp, tp) mesh for its layouts, every parameter
    zeroed, then ``shardspec.checkpoint.load`` of what transformers saved at ``saved`` into
    the parameters: each parameter's shard."""
    from shardspec.checkpoint import load

    model = _load(path, tp, fsdp)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.zero_()
    load(params, saved)
    return _shards(model)
