"""For tests: run the planner's NumPy set-up and grid / tree indexes on small layouts too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from shardspec.reshard import index as index_module, planner as planner_module


@contextlib.contextmanager
def indexed(force: bool) -> Iterator[None]:
    """With ``force``, small layouts take the NumPy set-up and the grid / tree indexes that
    layouts of more than 16 shards take (they normally take the plain-Python scan), so both
    paths meet every generated case."""
    saved = planner_module._SMALL, index_module._SCAN
    if force:
        planner_module._SMALL, index_module._SCAN = 0, 0
    try:
        yield
    finally:
        planner_module._SMALL, index_module._SCAN = saved
