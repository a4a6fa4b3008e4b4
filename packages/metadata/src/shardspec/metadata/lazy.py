"""Names a package exports but loads on first use (PEP 562), so that importing it stays
torch-free: shared by the shardspec packages' ``__init__`` modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps an exported name to the
    submodule that defines it; a name is imported once, then kept in ``namespace`` (the
    package's globals)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
