"""The world functions DeepSpeed's ranks run (``shardspec.testing.run_world``): a ZeRO engine
of a model of drawn shapes, its values set, saved with ``engine.save_checkpoint``; and a fresh
engine on another world and stage loading the universal checkpoint ``ds_to_universal`` made of
it. Imported only in the venv ``nox -s peers_deepspeed`` builds.

DeepSpeed runs on CPU here (``DS_ACCELERATOR=cpu``, gloo: the pool's process group, which
``deepspeed.init_distributed`` adopts). One shim, named in the report's header: DeepSpeed's
CPU backend compiles a shared-memory all-reduce (``ShareMemCommBuilder``) with the host's C++
compiler when it starts; :func:`_no_op_compilation` answers "not available" instead, so no
op is compiled (its collectives are then torch's gloo ones).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from conformance.reference import zero_truth

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
SHIM = (
    "DS_ACCELERATOR=cpu; DeepSpeed's shared-memory all-reduce (ShareMemCommBuilder) not "
    "compiled: deepspeed.comm.torch.build_shm_op answers None, so its collectives are gloo's"
)


def _no_op_compilation() -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    # not `import deepspeed.comm.torch as ...`: deepspeed.comm re-exports the torch module
    # under that name, so the attribute lookup the `as` form makes finds torch itself
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    ds_torch.build_shm_op = lambda: None
    return deepspeed


class Params(torch.nn.Module):
    """One parameter a shape, named ``p0``, ``p1``, ... in the order given."""

    def __init__(self, shapes: list[list[int]], dtype: torch.dtype, fill: float) -> None:
        super().__init__()
        for i, s in enumerate(shapes):
            self.register_parameter(
                f"p{i}", torch.nn.Parameter(torch.full(s, fill, dtype=dtype), requires_grad=True)
            )

    def forward(self) -> torch.Tensor:
        return sum((p.float().sum() for p in self.parameters()), torch.zeros(()))


def _engine(world: int, stage: int, dtype: str, shapes: list[list[int]], fill: float, **ck: Any):
    deepspeed = _no_op_compilation()
    # one host: a rank's local rank is its rank (what torchrun would set)
    os.environ["LOCAL_RANK"] = str(torch.distributed.get_rank())
    deepspeed.init_distributed(dist_backend="gloo")
    backend = importlib.import_module("deepspeed.comm.comm").cdb
    if getattr(backend, "shm_comm_op", None) is not None:  # the report's header says none is
        raise RuntimeError("DeepSpeed built its shared-memory all-reduce: the shim did not take")
    dt = getattr(torch, dtype)
    model = Params(shapes, dt, fill)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dt == torch.bfloat16},
        "steps_per_print": 1 << 30,
    }
    if ck:
        config["checkpoint"] = ck
    if stage == 3:
        # every parameter partitioned, however small (its default keeps small ones whole)
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def _flat_partition(engine: Any) -> dict[str, torch.Tensor]:
    """This rank's flat fp32 partition of the (one) parameter group and Adam's moments of it,
    whichever ZeRO optimizer holds them."""
    opt = engine.optimizer
    for name in (
        "single_partition_of_fp32_groups",  # ZeRO-1/2
        "fp32_groups_flat_partition",  # BF16_Optimizer (bf16 with ZeRO-1)
        "fp32_partitioned_groups_flat",  # ZeRO-3
    ):
        groups = getattr(opt, name, None)
        if groups:
            break
    else:
        raise RuntimeError(f"no flat fp32 partition found on {type(opt).__name__}")
    if len(groups) != 1:
        raise RuntimeError(f"{len(groups)} parameter groups on {type(opt).__name__}; one made")
    flat = groups[0]
    state = opt.optimizer.state[flat]
    return {
        "fp32": flat.detach().clone(),
        "exp_avg": state["exp_avg"].detach().clone(),
        "exp_avg_sq": state["exp_avg_sq"].detach().clone(),
    }


def _full(engine: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Every parameter's full fp32 value and Adam moments by DeepSpeed's own accessors, and
    the module's parameter as the model holds it (gathered under ZeRO-3)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in engine.module.named_parameters():
        got = {
            "fp32": safe_get_full_fp32_param(p),
            "exp_avg": safe_get_full_optimizer_state(p, "exp_avg"),
            "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq"),
        }
        if getattr(p, "ds_numel", p.numel()) == 0:  # ZeRO-3's own p.numel() is its partition's
            # no element: DeepSpeed keeps it out of the optimizer, and there is nothing to read
            got = {k: torch.zeros(0) if v is None else v for k, v in got.items()}
        out[name] = {k: v.detach().clone().reshape(-1) for k, v in got.items() if v is not None}
    if getattr(engine, "zero_optimization_stage", lambda: 0)() == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            for name, p in engine.module.named_parameters():
                out[name]["param"] = p.detach().clone().reshape(-1)
    else:
        for name, p in engine.module.named_parameters():
            out[name]["param"] = p.detach().clone().reshape(-1)
    return out


def _set(
    p: Any, value: torch.Tensor, key: str, rank: int, world: int, stage: int, full: bool = False
) -> None:
    """Set parameter ``p``'s full fp32 value or Adam moment ``key`` to ``value``: by
    DeepSpeed's ``safe_set_full_*`` under ZeRO-1/2; under ZeRO-3 by ``safe_set_local_*`` with
    this rank's FLAT-7 slice, zero-padded, because 0.19.8's full setter narrows past the end of
    the value on the last rank when numel does not divide by dp (``Stage3.set_full_hp_param``,
    repro ``deepspeed-zero3-set-full-past-the-end``), unless ``full`` asks for it."""
    from deepspeed import utils

    if stage != 3 or full:
        if key == "fp32":
            utils.safe_set_full_fp32_param(p, value.clone())
        else:
            utils.safe_set_full_optimizer_state(p, value.clone(), key)
        return
    flat = value.reshape(-1)
    size = -(-flat.numel() // world)
    local = torch.zeros(size, dtype=flat.dtype)
    part = flat[min(rank * size, flat.numel()) : (rank + 1) * size]
    local[: part.numel()] = part
    if key == "fp32":
        utils.safe_set_local_fp32_param(p, local)
    else:
        utils.safe_set_local_optimizer_state(p, local, key)


def save_world(
    rank: int, world: int, path: str, stage: int, dtype: str, shapes: list[list[int]]
) -> dict[str, Any]:
    """A ZeRO-``stage`` engine of ``shapes`` on ``world`` ranks, one Adam step, then every
    parameter's fp32 value and Adam moments set to :func:`zero_truth`'s through DeepSpeed's
    own setters (:func:`_set`), saved under ``path`` (tag ``"saved"``).
    Returns this rank's flat partition (FLAT-6, FLAT-7) and what the accessors read back."""
    engine = _engine(world, stage, dtype, shapes, fill=1.0)
    loss = engine()
    engine.backward(loss)
    engine.step()
    truth = zero_truth(shapes)
    for i, (_, p) in enumerate(engine.module.named_parameters()):
        for key in KEYS:
            _set(p, truth[key][i].reshape(shapes[i]), key, rank, world, stage)
    engine.save_checkpoint(path, tag="saved")
    return {"partition": _flat_partition(engine), "read": _full(engine)}


def set_world(
    rank: int, world: int, stage: int, dtype: str, shapes: list[list[int]]
) -> dict[str, Any]:
    """As :func:`save_world` up to the save, every value set by DeepSpeed's full setters
    (``safe_set_full_*``) at every stage: this rank's flat partition."""
    engine = _engine(world, stage, dtype, shapes, fill=1.0)
    engine.backward(engine())
    engine.step()
    truth = zero_truth(shapes)
    for i, (_, p) in enumerate(engine.module.named_parameters()):
        for key in KEYS:
            _set(p, truth[key][i].reshape(shapes[i]), key, rank, world, stage, full=True)
    return {"partition": _flat_partition(engine)}


def load_world(
    rank: int,
    world: int,
    path: str,
    tag: str,
    stage: int,
    dtype: str,
    shapes: list[list[int]],
) -> dict[str, Any]:
    """A fresh ZeRO-``stage`` engine of ``shapes`` on ``world`` ranks (every value 7) loading
    the universal checkpoint ``tag`` under ``path``: this rank's flat partition and every
    parameter's values as DeepSpeed's accessors and the module read them."""
    engine = _engine(world, stage, dtype, shapes, fill=7.0, load_universal=True)
    engine.load_checkpoint(path, tag=tag)
    return {"partition": _flat_partition(engine), "read": _full(engine)}


def to_universal(path: str) -> str:
    """``ds_to_universal`` as its users run it (its command line, no process group), from
    ``path/saved`` into ``path/universal``: ``--inject_missing_state``, which its docs name for
    a model that is not Megatron-DeepSpeed's (whose training loop writes the
    ``universal_checkpoint_info`` it asks for), one worker a stage. Returns its output."""
    import subprocess
    import sys

    cmd = [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", os.path.join(path, "saved"),
        "--output_folder", os.path.join(path, "universal"),
        "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=600)
    if done.returncode:
        raise RuntimeError(
            f"ds_to_universal exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return done.stdout


def zero_to_fp32(path: str) -> dict[str, torch.Tensor]:
    """``zero_to_fp32``'s state dict of ``path/saved``: each parameter's fp32 value."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    sd = get_fp32_state_dict_from_zero_checkpoint(path, tag="saved")
    return {k: v.detach().clone() for k, v in sd.items()}
