"""What running a peer's package (Megatron-Core) on this runtime's CPU ranks needs.

Megatron-Core 0.19.2's ``dist_checkpointing.save`` calls ``torch.cuda.synchronize()``
(``strategies/filesystem_async.py``) and ``torch.cuda.current_device()``
(``strategies/state_dict_saver.py``) even when every tensor is on the CPU, which a CPU-only
torch refuses. Its resharding (``megatron.core.resharding``: ``execution.py`` and the gloo
copy service) makes a ``torch.cuda.Stream()``, runs its copies under ``torch.cuda.stream``,
synchronizes, and stages through ``pin_memory=True`` buffers. :func:`megatron_cpu_patch`
answers those calls, in those four modules only, when CUDA is absent; everything else of
Megatron and torch is left as it is.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["MEGATRON_CPU_PATCH", "megatron_cpu_patch"]

MEGATRON_CPU_PATCH = (
    "without CUDA, torch.cuda.synchronize() in megatron.core.dist_checkpointing.strategies."
    "filesystem_async is a no-op and torch.cuda.current_device() in ...strategies."
    "state_dict_saver answers 'cpu'; in megatron.core.resharding.execution and "
    "copy_services.gloo_copy_service, torch.cuda's streams, events and synchronize() are no-ops "
    "and torch.empty(pin_memory=True) allocates unpinned (those four modules only)"
)


class _NoOp:
    """A CUDA stream or event on a CPU-only torch: every call does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _CpuCuda:
    """What the four modules ask of ``torch.cuda``, answered for a CPU-only torch."""

    @staticmethod
    def synchronize(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def Stream(*args: Any, **kwargs: Any) -> _NoOp:
        return _NoOp()

    @staticmethod
    def Event(*args: Any, **kwargs: Any) -> _NoOp:
        return _NoOp()

    @staticmethod
    def current_stream(*args: Any, **kwargs: Any) -> _NoOp:
        return _NoOp()

    @staticmethod
    def stream(*args: Any, **kwargs: Any) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


class _TorchWithCpuCuda:
    """``torch`` as those modules see it: all of torch but ``cuda``, and ``empty`` without
    pinned memory (which needs CUDA)."""

    cuda = _CpuCuda()

    @staticmethod
    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def megatron_cpu_patch() -> bool:
    """Point the four modules' ``torch`` at a stand-in whose ``cuda`` answers for the CPU, when
    CUDA is absent; True when patched (idempotent)."""
    if torch.cuda.is_available():
        return False
    from megatron.core.dist_checkpointing.strategies import (  # type: ignore[import-not-found]
        filesystem_async,
        state_dict_saver,
    )
    from megatron.core.resharding import execution  # type: ignore[import-not-found]
    from megatron.core.resharding.copy_services import (  # type: ignore[import-not-found]
        gloo_copy_service,
    )

    for module in (filesystem_async, state_dict_saver, execution, gloo_copy_service):
        if not isinstance(module.torch, _TorchWithCpuCuda):
            module.torch = _TorchWithCpuCuda()
    return True
