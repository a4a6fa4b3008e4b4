"""Which backend and device the ranks use, and which world sizes this machine can run.

``SHARDSPEC_BACKEND`` picks the process-group backend (``gloo`` default, ``nccl``) and
``SHARDSPEC_DEVICE`` the device the ranks' tensors live on (``cpu`` default; ``cuda`` under
NCCL always). NCCL gives each rank its own GPU; gloo with ``SHARDSPEC_DEVICE=cuda`` lets every
rank share the GPUs there are (gloo's collectives take CUDA tensors), which is how a one-GPU
machine exercises the device paths of the code under test with more than one rank.
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "backend",
    "cuda_devices",
    "default_timeout",
    "device_type",
    "launcher_rank",
    "max_world_size",
    "rank_device",
    "simulated_worlds",
    "skip_reason",
    "world_sizes",
]


def backend() -> str:
    """``nccl`` when asked for with ``SHARDSPEC_BACKEND=nccl``, else ``gloo``."""
    return os.environ.get("SHARDSPEC_BACKEND", "gloo")


def device_type(backend_name: str | None = None) -> str:
    """``cuda`` under NCCL or with ``SHARDSPEC_DEVICE=cuda``, else ``cpu``."""
    if (backend_name or backend()) == "nccl":
        return "cuda"
    return os.environ.get("SHARDSPEC_DEVICE", "cpu")


def default_timeout() -> float:
    return float(os.environ.get("SHARDSPEC_POOL_TIMEOUT", "10"))


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_world_size() -> int:
    """The largest world size the suite uses (``SHARDSPEC_MAX_WORLD``, default 4; on NCCL at
    most the number of GPUs)."""
    w = int(os.environ.get("SHARDSPEC_MAX_WORLD", "4"))
    if os.environ.get("SHARDSPEC_LAUNCHED") == "1":  # the launcher's ranks besides the driver
        return min(w, int(os.environ.get("WORLD_SIZE", "1")) - 1)
    if backend() == "nccl":
        w = min(w, cuda_devices())
    return w


def skip_reason(
    world_size: int,
    *,
    backend_name: str | None = None,
    device_count: int | None = None,
    max_world: int | None = None,
    device: str | None = None,
) -> str | None:
    """Why a pool of ``world_size`` ranks cannot run here, or None when it can. NCCL needs one
    GPU per rank (ranks never share a device); gloo on CUDA needs one GPU; every backend stops
    at SHARDSPEC_MAX_WORLD."""
    name = backend_name or backend()
    n = cuda_devices() if device_count is None else device_count
    if os.environ.get("SHARDSPEC_LAUNCHED") == "1":
        ranks = int(os.environ.get("WORLD_SIZE", "1")) - 1
        if world_size > ranks:
            return (
                f"world size {world_size} needs {world_size} launcher ranks besides the "
                f"driver; torchrun started {ranks}"
            )
        return None
    if name == "nccl":
        if world_size > n:
            return (
                f"world size {world_size} needs {world_size} CUDA GPUs under "
                f"SHARDSPEC_BACKEND=nccl (one per rank); this machine has {n}"
            )
    elif (device or device_type(name)) == "cuda" and n < 1:
        return "SHARDSPEC_DEVICE=cuda needs a CUDA GPU; this machine has none"
    limit = int(os.environ.get("SHARDSPEC_MAX_WORLD", "4")) if max_world is None else max_world
    if world_size > limit:
        return f"world size {world_size} > SHARDSPEC_MAX_WORLD={limit}"
    return None


def rank_device(rank: int, backend_name: str, device: str | None = None) -> str:
    """The device of pool rank ``rank``: ``cuda:<rank>`` under NCCL (one GPU per rank, which
    :func:`skip_reason` guarantees exist), ``cuda:<rank mod GPUs>`` for gloo on CUDA, else
    ``cpu``."""
    if backend_name == "nccl":
        return f"cuda:{rank}"
    if (device or device_type(backend_name)) == "cuda":
        return f"cuda:{rank % max(cuda_devices(), 1)}"
    return "cpu"


def _sizes_from(variable: str, default: str) -> list[int]:
    raw = os.environ.get(variable, default)
    try:
        sizes = sorted({int(x) for x in raw.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{variable} must be comma-separated integers, got {raw!r}") from None
    if any(w < 1 for w in sizes):
        raise ValueError(f"{variable} sizes must be >= 1, got {raw!r}")
    return sizes


def simulated_worlds() -> list[int]:
    """The world sizes to simulate in this process (``SHARDSPEC_SIM_WORLDS``, e.g.
    ``8,64,512,1024``; none by default)."""
    return _sizes_from("SHARDSPEC_SIM_WORLDS", "")


LOCAL_WORLDS = "8,16,64"


def local_worlds() -> list[int]:
    """The world sizes run as one program under ``LocalTensorMode``
    (:mod:`.local_tensor`; ``SHARDSPEC_LOCAL_WORLDS``, default 8, 16 and 64)."""
    return _sizes_from("SHARDSPEC_LOCAL_WORLDS", LOCAL_WORLDS)


def world_sizes() -> list[int]:
    """The world sizes tests draw from: the simulated ones when ``SHARDSPEC_SIM_WORLDS`` is
    set, else 1 to :func:`max_world_size`."""
    return simulated_worlds() or list(range(1, max(1, max_world_size()) + 1))


def launcher_rank() -> int:
    """This process's rank when a launcher (torchrun) started it, else 0."""
    return int(os.environ.get("RANK", "0"))
