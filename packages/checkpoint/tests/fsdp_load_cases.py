"""Rank-side functions for test_load_fsdp.py: the uneven FSDP2 (+ TP) model of
``shardspec.testing.fsdp_model`` after one Adam step, saved with ``dcp.save`` from
``get_state_dict`` on one mesh, and loaded on another into a fresh model's state dicts by
``dcp.load`` (the meaning ``shardspec.checkpoint.load`` must have) and by
``shardspec.checkpoint.load`` with each read mode."""

from __future__ import annotations

from typing import Any

import torch

from shardspec.testing.fsdp_model import DIMS, fsdp2_on_mesh, make_model


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as one dict of dotted keys (as DCP flattens them)."""
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
    return out


def _state(model: Any, opt: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _adam(model: Any) -> Any:
    return torch.optim.Adam(model.parameters(), lr=0.1)


def save_trained(rank: int, world: int, path: str, mesh: list[int]) -> dict[str, Any]:
    """One Adam step of the model under FSDP2 on ``mesh`` (TP when its last dim > 1), then
    ``dcp.save`` of its model and optimizer state dicts; returns every saved tensor whole."""
    import torch.distributed.checkpoint as dcp

    model = fsdp2_on_mesh(make_model(), tuple(mesh))
    opt = _adam(model)
    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    opt.step()
    sd = _state(model, opt)
    dcp.save(sd, checkpoint_id=path)
    flat = _flat(sd)
    return {k: v.full_tensor() for k, v in sorted(flat.items()) if hasattr(v, "full_tensor")}


def load_trained(rank: int, world: int, path: str, mesh: list[int], how: str) -> dict[str, Any]:
    """A fresh model (other weights) under FSDP2 on ``mesh``, its state dicts (Adam's state
    made by ``get_state_dict``) filled from ``path`` by ``dcp.load`` (``how`` "dcp") or by
    ``shardspec.checkpoint.load(reads=how)``, then set back into the model and optimizer.
    Returns each entry's local tensor (or value), each DTensor whole, and the read mode."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from shardspec.checkpoint import load

    model = fsdp2_on_mesh(make_model(seed=5), tuple(mesh))
    opt = _adam(model)
    sd = _state(model, opt)
    reads = None
    if how == "dcp":
        dcp.load(sd, checkpoint_id=path)
    else:
        reads = load(sd, path, reads=how).reads
    flat = _flat(sd)
    local = {
        k: (v.to_local() if hasattr(v, "to_local") else v).clone()
        if isinstance(v, torch.Tensor)
        else v
        for k, v in flat.items()
    }
    whole = {k: v.full_tensor() for k, v in sorted(flat.items()) if hasattr(v, "full_tensor")}
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return {"local": local, "whole": whole, "reads": reads}
