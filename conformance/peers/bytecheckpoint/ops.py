"""ByteCheckpoint 0.0.2 on the suite's ranks: pool operations that save and load through its
public API (``bytecheckpoint.save`` / ``bytecheckpoint.load``), and the world functions of
its FSDP model runs. Imported by the pools only when ``SHARDSPEC_IMPL=bytecheckpoint``
(its adapter's ``rank_ops``), in the venv of ``nox -s peers_bytecheckpoint``; ByteCheckpoint
itself is imported on first use, held to loopback (:mod:`conformance.peers.bytecheckpoint.env`).

ByteCheckpoint's API takes ``{"model": <Stateful>, "optimizer": <Optimizer>, "extra_state":
<dict>}`` and a framework (``fsdp``, ``fsdp2``, ``ddp``); its ``fsdp2`` checkpointer saves
whatever the model's ``state_dict()`` holds through its FSDP planner (a copy of DCP's default
planner), so a state dict of one ShardedTensor or DTensor goes through it as a model's would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from conformance.codec import layout_from_json, placements_from_json
from conformance.ops.shared import dtensor_mesh, layout_check, mesh_check, sharded_tensor_of
from shardspec.testing.ops import Context, operation

__all__ = [
    "DAMAGES",
    "Holder",
    "damage",
    "extra_state_world",
    "model_load_world",
    "model_save_world",
    "version_check",
]

KEY = "t"
FRAMEWORK = "fsdp2"
DAMAGES = ("missing data file", "truncated data file", "no .metadata")


class Holder:
    """The least of a model ByteCheckpoint's API saves and loads: a state dict."""

    def __init__(self, sd: dict[str, Any]) -> None:
        self.sd = sd

    def state_dict(self) -> dict[str, Any]:
        return self.sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.sd = sd


def _bcp() -> Any:
    from conformance.peers.bytecheckpoint.env import hold_to_loopback

    hold_to_loopback()
    import bytecheckpoint

    return bytecheckpoint


def _listening() -> list[str]:
    from conformance.peers.bytecheckpoint.env import coordinator_listeners

    return coordinator_listeners()


@operation("bytecheckpoint.save", collective=True, check=layout_check)
def _save(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``bytecheckpoint.save`` of ``{"t": ShardedTensor}`` holding this rank's boxes of
    ``layout`` to ``path`` (framework ``fsdp2``); returns the non-loopback addresses this rank
    listens on after the save (must be none)."""
    bcp = _bcp()
    layout = layout_from_json(args["layout"])
    st = sharded_tensor_of(ctx, layout, getattr(torch, args["dtype"]), ts, "shardspec")
    bcp.save(args["path"], {"model": Holder({KEY: st})}, framework=FRAMEWORK)
    return {"listening": _listening()}, []


def _check_load(ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]) -> None:
    if args["kind"] == "sharded":
        layout_check(ctx, args, ts)
    elif args["kind"] == "dtensor":
        mesh_check(ctx, args)
    else:
        raise ValueError(f"kind must be 'sharded' or 'dtensor', got {args['kind']!r}")


@operation("bytecheckpoint.load", collective=True, check=_check_load)
def _load(
    ctx: Context, args: dict[str, Any], ts: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor]]:
    """``bytecheckpoint.load`` from ``path`` into ``{"t": ...}`` whose elements are all
    ``fill``: a ShardedTensor of this rank's boxes of ``layout`` (``kind`` sharded; ``ts`` the
    filled boxes) or a DTensor on ``mesh`` with ``placements`` (``kind`` dtensor). Returns the
    local tensors after the load and the DTensor's mesh coordinate."""
    bcp = _bcp()
    dtype = getattr(torch, args["dtype"])
    if args["kind"] == "sharded":
        obj = sharded_tensor_of(ctx, layout_from_json(args["layout"]), dtype, ts, "shardspec")
    else:
        from torch.distributed.tensor import distribute_tensor

        full = torch.full(tuple(args["shape"]), args["fill"], dtype=dtype, device=ctx.device)
        obj = distribute_tensor(
            full, dtensor_mesh(ctx, args), placements_from_json(args["placements"]),
            src_data_rank=None,
        )  # fmt: skip
    holder = Holder({KEY: obj})
    bcp.load(args["path"], {"model": holder}, framework=FRAMEWORK)
    got = holder.sd[KEY]
    if args["kind"] == "sharded":
        return None, [s.tensor for s in got.local_shards()]
    return {"coordinate": got.device_mesh.get_coordinate()}, [got.to_local()]


def damage(path: str, what: str) -> str:
    """Damage the ByteCheckpoint checkpoint at ``path`` (its ``model/`` directory) as
    ``what`` (one of :data:`DAMAGES`) says; returns the file it changed."""
    model = Path(path) / "model"
    data = sorted(p for p in model.iterdir() if p.suffix == ".distcp")
    if what == "missing data file":
        data[-1].unlink()
        return data[-1].name
    if what == "truncated data file":
        raw = data[-1].read_bytes()
        data[-1].write_bytes(raw[: max(0, len(raw) - 3)])
        return data[-1].name
    if what == "no .metadata":
        (model / ".metadata").unlink()
        return ".metadata"
    raise ValueError(f"unknown damage {what!r}; one of {DAMAGES}")


# --- the FSDP model runs (fresh worlds: conformance/tests/test_checkpoint_models.py) ---------


def _mesh_and_model(world: int, mesh: list[int], kind: str, seed: int) -> tuple[Any, Any]:
    """``shardspec.testing.fsdp_model``'s uneven MLP wrapped as ``kind`` says: ``fsdp2``
    (fully_shard over a 1-D mesh, or HSDP over a 2-D (replicate, shard) one), ``fsdp1``
    (FullyShardedDataParallel over the world) or ``plain`` (no wrapper)."""
    from shardspec.testing.fsdp_model import LINEARS, make_model

    model = make_model(seed=seed)
    if kind == "plain":
        return None, model
    from torch.distributed.device_mesh import init_device_mesh

    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return None, FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    names = ("replicate", "shard") if len(mesh) == 2 else ("shard",)
    dm = init_device_mesh("cpu", tuple(mesh), mesh_dim_names=names)
    from torch.distributed.fsdp import fully_shard

    for i in LINEARS:
        fully_shard(model[i], mesh=dm)
    fully_shard(model, mesh=dm)
    return dm, model


def _full(v: Any) -> Any:
    return v.full_tensor() if hasattr(v, "full_tensor") else v


def _framework(kind: str) -> str:
    return {"fsdp1": "fsdp", "fsdp2": "fsdp2", "plain": "fsdp2"}[kind]


def _named_state(model: Any, opt: Any) -> dict[str, Any]:
    """Every parameter and Adam state as a full tensor, by the plain model's names (DCP's
    full state dicts: the same names under FSDP1, FSDP2 and none)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    out: dict[str, Any] = {
        k: _full(v).detach().clone()
        for k, v in get_model_state_dict(model, options=options).items()
    }
    osd = get_optimizer_state_dict(model, opt, options=options)
    for fqn, state in osd["state"].items():
        for what, v in state.items():
            out[f"{fqn}.{what}"] = _full(v).detach().clone()
    return out


def model_save_world(rank: int, world: int, path: str, kind: str, mesh: list[int]) -> Any:
    """One Adam step of the uneven MLP under ``kind`` on ``mesh``, saved with
    ``bytecheckpoint.save`` (model and optimizer). Returns every value saved, as full tensors
    (DCP's full state dicts, read before the save), what those full state dicts read
    differently after the save, and the non-loopback addresses this rank listened on."""
    from shardspec.testing.fsdp_model import DIMS

    bcp = _bcp()
    _, model = _mesh_and_model(world, mesh, kind, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(3, DIMS[0], generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    opt.step()
    before = _named_state(model, opt)
    bcp.save(path, {"model": model, "optimizer": opt}, framework=_framework(kind))
    after = _named_state(model, opt)
    changed = [
        f"{k}: the full state dict reads other values after the save"
        for k, v in before.items()
        if k not in after or not torch.equal(_bits(v), _bits(after[k]))
    ]
    return {"saved": before, "changed": changed, "listening": _listening()}


def model_load_world(
    rank: int, world: int, path: str, kind: str, mesh: list[int], saved: dict[str, Any]
) -> list[str]:
    """A fresh model (other initial values) and Adam under ``kind`` on ``mesh``, loaded with
    ``bytecheckpoint.load``: every parameter and Adam state, gathered whole, must equal the
    saved full value bit for bit. Returns what differs."""
    bcp = _bcp()
    _, model = _mesh_and_model(world, mesh, kind, seed=5)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    bcp.load(path, {"model": model, "optimizer": opt}, framework=_framework(kind))
    got = _named_state(model, opt)
    bad = []
    for key, want in saved.items():
        if key not in got:
            bad.append(f"{key}: not loaded")
            continue
        g = got[key]
        if g.dtype != want.dtype or tuple(g.shape) != tuple(want.shape):
            bad.append(f"{key}: {g.dtype} {tuple(g.shape)}, saved {want.dtype} {tuple(want.shape)}")
        elif not torch.equal(_bits(g), _bits(want)):
            n = int((_bits(g) != _bits(want)).sum())
            bad.append(f"{key}: {n} bytes differ from the saved value")
    return bad


def _bits(t: Any) -> Any:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


# --- ByteCheckpoint's own checks (version, extra state) --------------------------------------


def version_check(release: str) -> str | None:
    """What ByteCheckpoint 0.0.2's save says of torch ``release``: None when it accepts it,
    else its refusal. Its own ``FSDP2Checkpointer.save`` runs with ``torch.__version__`` set to
    ``release`` and an empty state: its release check comes first, and an accepted release
    stops at the next check ("Model is a must") before any I/O or collective."""
    _bcp()
    from bytecheckpoint.checkpointer.fsdp2_checkpointer import FSDP2Checkpointer

    real = torch.__version__
    torch.__version__ = release  # type: ignore[assignment]
    try:
        FSDP2Checkpointer.save("/nonexistent", {})
    except AssertionError as e:
        if "only support torch version" in str(e):
            return str(e)
        return None
    finally:
        torch.__version__ = real  # type: ignore[assignment]
    return None


def extra_state_world(rank: int, world: int, path: str) -> dict[str, Any]:
    """Save ``extra_state`` (a training loop's step and torch's RNG state) beside a model and
    load it back with ByteCheckpoint's API. Returns whether it loaded equal, or the load's
    error."""
    bcp = _bcp()
    extra = {"step": 3, "torch_rng": torch.Generator().manual_seed(0).get_state()}
    model = Holder({KEY: torch.arange(6.0)})
    bcp.save(path, {"model": model, "extra_state": extra}, framework=FRAMEWORK)
    state: dict[str, Any] = {"model": Holder({KEY: torch.zeros(6)}), "extra_state": {}}
    try:
        bcp.load(path, state, framework=FRAMEWORK)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:800]}
    got = state["extra_state"]
    same = got.get("step") == 3 and torch.equal(got.get("torch_rng"), extra["torch_rng"])
    return {"loaded": bool(same)}
