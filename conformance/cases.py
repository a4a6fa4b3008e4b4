"""Per-test bookkeeping: which examples ran and which the implementation could not express.

A test body runs inside ``with case():``. An :class:`~conformance.impls.Unsupported` raised
inside ends that example without failing it and is counted; after the test, a test whose every
example was unsupported is skipped with the reason ("unsupported by torch: ..."), and a test
with some unsupported examples records their reasons for the report. Nothing is dropped
silently.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from conformance.interface import Unsupported

__all__ = ["TRACKER", "case"]


@dataclass
class Tracker:
    supported: int = 0
    unsupported: Counter[str] = field(default_factory=Counter)

    def reset(self) -> None:
        self.supported = 0
        self.unsupported = Counter()


TRACKER = Tracker()


@contextlib.contextmanager
def case() -> Iterator[None]:
    try:
        yield
    except Unsupported as e:
        TRACKER.unsupported[str(e)] += 1
    else:
        TRACKER.supported += 1
