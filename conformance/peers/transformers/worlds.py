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


def save_both_world(
    rank: int, world: int, path: str, tp: int, fsdp: int, dcp_out: str, st_out: str
) -> dict[str, Any]:
    """As :func:`load_world`, then ``save_pretrained`` twice: its distributed checkpoint to
    ``dcp_out`` and its consolidated safetensors to ``st_out``."""
    model = _load(path, tp, fsdp)
    model.save_pretrained(dcp_out, distributed_checkpoint=True)
    model.save_pretrained(st_out, distributed_checkpoint=False)
    return _shards(model)


def load_many_world(rank: int, world: int, paths: list[str], tp: int, fsdp: int) -> list[Any]:
    """``from_pretrained`` of each of ``paths`` in turn on one (fsdp, tp) mesh: each load's
    shards, in order."""
    out = []
    for p in paths:
        model = _load(p, tp, fsdp)
        out.append(_shards(model))
        del model
    return out


def _moments(model: Any, optimizer: Any) -> dict[str, dict[str, Any]]:
    """Each parameter's Adam moments as :func:`_shards` gives parameters, under keys
    ``exp_avg`` and ``exp_avg_sq`` (their own placements, mesh and coordinate)."""
    from torch.distributed.tensor import DTensor

    out: dict[str, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        state = optimizer.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            if isinstance(t, DTensor):
                entry = {
                    "mesh": list(t.device_mesh.shape),
                    "coordinate": list(t.device_mesh.get_coordinate() or []),
                    "placements": placements_to_json(t.placements),
                    "local": t.to_local().detach().clone(),
                }
            else:
                entry = {"mesh": [], "coordinate": [], "placements": [], "local": t.clone()}
            out[f"{name}:{key}"] = entry
    return out


def _adam(model: Any) -> Any:
    """AdamW over the model with every moment made (one step of zero gradients at lr 0)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return optimizer


def optimizer_save_world(
    rank: int, world: int, path: str, tp: int, fsdp: int, moments: dict[str, Any], out: str
) -> dict[str, Any]:
    """``from_pretrained`` on a (fsdp, tp) mesh, AdamW's moments set to ``moments`` (full
    tensors by ``name:exp_avg`` / ``name:exp_avg_sq``, each rank writing its placements'
    slice), then ``save_optimizer_distributed`` to ``out``: each moment's shard."""
    from torch.distributed.tensor import DTensor
    from transformers.distributed.checkpoint import save_optimizer_distributed

    from conformance import reference

    model = _load(path, tp, fsdp)
    optimizer = _adam(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            for key in ("exp_avg", "exp_avg_sq"):
                t, full = optimizer.state[p][key], moments[f"{name}:{key}"]
                if isinstance(t, DTensor):
                    mesh = t.device_mesh
                    idx = reference.dtensor_indices(
                        full.shape, list(mesh.shape), placements_to_json(t.placements),
                        list(mesh.get_coordinate() or []),
                    )  # fmt: skip
                    t.to_local().copy_(reference.gather(full, idx))
                else:
                    t.copy_(full)
    save_optimizer_distributed(model, optimizer, out)
    return _moments(model, optimizer)


def optimizer_load_world(
    rank: int, world: int, path: str, tp: int, fsdp: int, saved: str
) -> dict[str, Any]:
    """``from_pretrained`` on a (fsdp, tp) mesh, a fresh AdamW, then
    ``load_optimizer_distributed`` from ``saved``: each moment's shard."""
    from transformers.distributed.checkpoint import load_optimizer_distributed

    model = _load(path, tp, fsdp)
    optimizer = _adam(model)
    load_optimizer_distributed(model, optimizer, saved)
    return _moments(model, optimizer)
