"""Implementations under test, behind one adapter interface.

``get_impl(name)`` returns the adapter: ``shardspec`` (ours), ``torch`` (upstream), or
``broken`` (test-only: ours with chunk offsets off by one on uneven dims, which the suite must
catch). The suite picks one with ``SHARDSPEC_IMPL`` or ``pytest --impl``.

Every adapter method answers one question the spec settles. A method an implementation cannot
answer raises :class:`Unsupported` with the reason; the suite reports that case as
"unsupported by <impl>: <reason>" instead of passing or skipping it silently.

The interface is :mod:`.interface`; the adapters (:mod:`.ours`, :mod:`.upstream`,
:mod:`.broken`) import it and :mod:`.dcp_memory`, never this package, which only picks one.
"""

from __future__ import annotations

import os

from .interface import Impl, Unsupported

__all__ = ["IMPLS", "Impl", "Unsupported", "get_impl", "impl_name"]


def impl_name() -> str:
    return os.environ.get("SHARDSPEC_IMPL", "shardspec")


def _load(name: str) -> Impl:
    if name == "shardspec":
        from .ours import ShardspecImpl

        return ShardspecImpl()
    if name == "torch":
        from .upstream import TorchImpl

        return TorchImpl()
    if name == "broken":
        from .broken import BrokenImpl

        return BrokenImpl()
    raise ValueError(f"unknown implementation {name!r}; choose one of {IMPLS}")


IMPLS = ("shardspec", "torch", "broken")
_CACHE: dict[str, Impl] = {}


def get_impl(name: str | None = None) -> Impl:
    name = name or impl_name()
    if name not in _CACHE:
        _CACHE[name] = _load(name)
    return _CACHE[name]
