"""What planning derives from a layout (that it is valid, its distinct boxes and their index),
kept by the layout's identity for as long as the layout lives.

A layout is immutable, so anything computed from it stays true; and one layout meets many
others (a refit's source against each of its experts' destinations, a state dict whose layers
share layouts), so recomputing per plan made each of them cost O(W log W) in the world size.
Entries are keyed by ``id`` and dropped when the layout dies (a weak reference), so a cache
never pins a layout nor answers for a new one at a recycled address. A failed check is not
kept: an invalid layout raises each time it is asked.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from shardspec.metadata import Layout

__all__ = ["derived", "validated"]

T = TypeVar("T")

_CACHE: dict[int, tuple[weakref.ref[Layout], dict[str, Any]]] = {}
# A simulated world's ranks are threads that plan at once. Reentrant: a layout's weak-reference
# callback (which takes the lock) may run inside any allocation, also one made under it.
_LOCK = threading.RLock()


def derived(layout: Layout, what: str, make: Callable[[Layout], T]) -> T:
    """``make(layout)``, computed once per layout object under the name ``what``."""
    key = id(layout)
    with _LOCK:
        entry = _CACHE.get(key)
        if entry is not None and entry[0]() is layout and what in entry[1]:
            value: T = entry[1][what]
            return value
    value = make(layout)  # outside the lock: it may be long, and it may raise
    with _LOCK:
        entry = _CACHE.get(key)
        if entry is None or entry[0]() is not layout:
            entry = (weakref.ref(layout, _dropper(key)), {})
            _CACHE[key] = entry
        entry[1].setdefault(what, value)
    return value


def _dropper(key: int) -> Callable[[weakref.ref[Layout]], None]:
    # The cache and lock are bound now: at interpreter exit a layout may die after this
    # module's globals are cleared.
    def drop(ref: weakref.ref[Layout], cache: dict[int, Any] = _CACHE, lock: Any = _LOCK) -> None:
        with lock:
            entry = cache.get(key)
            if entry is not None and entry[0] is ref:
                del cache[key]

    return drop


def validated(layout: Layout) -> Layout:
    """``layout.validate()``, run once per layout object (a failure raises every time)."""
    return derived(layout, "valid", Layout.validate)
