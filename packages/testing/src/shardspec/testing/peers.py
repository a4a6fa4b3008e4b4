"""What running a peer's package (Megatron-Core) on this runtime's CPU ranks needs.

Megatron-Core 0.19.2's ``dist_checkpointing.save`` calls ``torch.cuda.synchronize()``
(``strategies/filesystem_async.py``) and ``torch.cuda.current_device()``
(``strategies/state_dict_saver.py``) even when every tensor is on the CPU, which a CPU-only
torch refuses. :func:`megatron_cpu_patch` answers those two calls, in those two modules only,
when CUDA is absent; everything else of Megatron and torch is left as it is.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MEGATRON_CPU_PATCH", "megatron_cpu_patch"]

MEGATRON_CPU_PATCH = (
    "without CUDA, torch.cuda.synchronize() in megatron.core.dist_checkpointing.strategies."
    "filesystem_async is a no-op and torch.cuda.current_device() in ...strategies."
    "state_dict_saver answers 'cpu' (those two modules only)"
)


class _CpuCuda:
    """What the two modules ask of ``torch.cuda``, answered for a CPU-only torch."""

    @staticmethod
    def synchronize(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def current_device() -> str:
        return "cpu"


class _TorchWithCpuCuda:
    """``torch`` as those two modules see it: all of torch but ``cuda``."""

    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def megatron_cpu_patch() -> bool:
    """Point the two modules' ``torch`` at a stand-in whose ``cuda`` answers for the CPU, when
    CUDA is absent; True when patched (idempotent)."""
    if torch.cuda.is_available():
        return False
    from megatron.core.dist_checkpointing.strategies import (  # type: ignore[import-not-found]
        filesystem_async,
        state_dict_saver,
    )

    for module in (filesystem_async, state_dict_saver):
        if not isinstance(module.torch, _TorchWithCpuCuda):
            module.torch = _TorchWithCpuCuda()
    return True
