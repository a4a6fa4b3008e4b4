"""The small real ByteCheckpoint checkpoint our checkpoint tools are tested on
(``packages/checkpoint/tests/data/bytecheckpoint-0.0.2-fsdp2-uneven``, CKPT-19).

Two gloo ranks, FSDP2 (``fully_shard``) over both, the model ``Linear(5, 7) -> ReLU ->
Linear(7, 3)`` in bfloat16: the weights 7x5 and 3x7 and the biases 7 and 3 split 4/3 and 2/1.
Every value comes from a formula, so a reader of the files can rebuild it without running
anything of ByteCheckpoint's: parameter ``i`` (in ``named_parameters`` order) of ``n``
elements is ``(arange(n) - n // 2) / 8 + i``, its gradient ``(arange(n) % 5 - 2) / 4``, and one
``Adam(lr=0.125, betas=(0.5, 0.75), foreach=False)`` step is taken. With those numbers every
intermediate of Adam is exact in bfloat16, so the sharded step equals the plain model's bit
for bit: ``exp_avg = g / 2``, ``exp_avg_sq = g * g / 4``, the parameter moves by
``0.125 * sign(g)``, ``step = 1.0`` (float32). ``bytecheckpoint.save(path, {"model": m,
"optimizer": opt}, framework="fsdp2")`` writes ``model/`` and ``optimizer/``, each a directory
with ByteCheckpoint's ``.metadata`` and one raw-bytes data file per rank.

Regenerate (in the venv of ``nox -s peers_bytecheckpoint``, which has ByteCheckpoint)::

    python -m conformance.peers.bytecheckpoint.data OUT_DIR

:func:`generate` checks, on each rank, that the model it saves equals :func:`expected` (the
plain model after the same step); ``conformance/tests/test_bytecheckpoint.py`` checks that a
fresh checkpoint from it holds the committed one's values; the package tests
(``packages/checkpoint/tests/test_bytecheckpoint_files.py``) rebuild the values from the same
formula.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["DIMS", "SEED_FORMULA", "expected", "generate", "save_world"]

DIMS = (5, 7, 3)
LR, BETAS = 0.125, (0.5, 0.75)
SEED_FORMULA = (
    "param i of n elements: (arange(n) - n // 2) / 8 + i; grad: (arange(n) % 5 - 2) / 4; "
    "Adam(lr=0.125, betas=(0.5, 0.75), foreach=False), one step; bfloat16"
)


def make_model() -> Any:
    """The model before its step, every parameter by the formula."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIMS[0], DIMS[1]), nn.ReLU(), nn.Linear(DIMS[1], DIMS[2]))
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            n = p.numel()
            p.copy_(((torch.arange(n) - n // 2).to(torch.bfloat16) / 8 + i).reshape(p.shape))
    return model


def grad_of(p: Any) -> Any:
    import torch

    n = p.numel()
    return ((torch.arange(n) % 5 - 2).to(torch.bfloat16) / 4).reshape(p.shape)


def optimizer(params: Any) -> Any:
    import torch

    return torch.optim.Adam(params, lr=LR, betas=BETAS, foreach=False)


def expected() -> dict[str, Any]:
    """What the checkpoint holds, from the plain (unsharded) model after the same step: the
    model state dict's keys (``0.weight``, ...) and the optimizer's as DCP flattens them
    (``state.0.weight.exp_avg``, ...)."""
    model = make_model()
    opt = optimizer(model.parameters())
    for p in model.parameters():
        p.grad = grad_of(p)
    opt.step()
    out: dict[str, Any] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, p in model.named_parameters():
        for what, v in opt.state[p].items():
            out[f"state.{name}.{what}"] = v.detach().clone()
    return out


def save_world(rank: int, world: int, path: str) -> dict[str, Any]:
    """One rank of the save: FSDP2 over the world, one step, ``bytecheckpoint.save``. Returns
    the local shapes, the keys whose local values differ from :func:`expected`'s slice, and
    the non-loopback addresses this rank listened on during the save (must be none)."""
    from conformance.peers.bytecheckpoint.env import coordinator_listeners, hold_to_loopback

    hold_to_loopback()
    import bytecheckpoint
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    model = make_model()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optimizer(model.parameters())
    for p in model.parameters():
        p.grad = distribute_tensor(grad_of(p), p.device_mesh, p.placements, src_data_rank=None)
    opt.step()
    want = expected()
    bad = []
    for name, p in model.named_parameters():
        values = {name: p, **{f"state.{name}.{k}": v for k, v in opt.state[p].items()}}
        for key, v in values.items():
            local = v.to_local() if hasattr(v, "to_local") else v
            full = want[key]
            if local.dim():
                start = sum(s for s in _chunk_sizes(full.shape[0], world)[: mesh.get_local_rank()])
                full = full[start : start + local.shape[0]]
            if not _same_bits(local.detach(), full):
                bad.append(key)
    bytecheckpoint.save(path, {"model": model, "optimizer": opt}, framework="fsdp2")
    return {
        "local": {n: list(p.to_local().shape) for n, p in model.named_parameters()},
        "differs": bad,
        "listening": coordinator_listeners(),
    }


def _chunk_sizes(n: int, world: int) -> list[int]:
    per = -(-n // world)
    return [max(0, min(per, n - per * r)) for r in range(world)]


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    return bool(
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.reshape(-1).contiguous().view(torch.uint8),
            b.reshape(-1).contiguous().view(torch.uint8),
        )
    )


def generate(out: str | Path, timeout: float = 240.0) -> dict[int, Any]:
    """Write the checkpoint to ``out`` (which must not exist) on two fresh gloo ranks; raises
    when a rank fails or its model differs from the formula."""
    from shardspec.testing import run_world

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; give a new directory")
    results = run_world(
        "conformance.peers.bytecheckpoint.data:save_world", 2, str(out), timeout=timeout
    )
    bad = {r: v for r, (status, v) in results.items() if status != "ok"}
    if bad:
        raise RuntimeError(f"the save failed: {bad}")
    for r, (_, v) in results.items():
        if v["differs"] or v["listening"]:
            raise RuntimeError(f"rank {r}: {v}")
    return {r: v for r, (_, v) in results.items()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m conformance.peers.bytecheckpoint.data OUT_DIR")
    print(generate(sys.argv[1]))
