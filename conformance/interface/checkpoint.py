"""The checkpoint area: a checkpoint's chunk check and read planning (CKPT-1 to CKPT-3).

Its tests: ``conformance/tests/test_checkpoint.py``,
``conformance/tests/test_checkpoint_load.py``. An adapter takes part by subclassing
:class:`Checkpoint` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Box


class Checkpoint(Adapter):
    """A checkpoint's chunk check and read planning (CKPT-1 to CKPT-3)."""

    area = "checkpoint"

    def checkpoint_accepts(self, shape: Sequence[int], chunks: Sequence[Box]) -> bool:
        """True when the implementation's check of a tensor's saved chunks (CKPT-1) accepts
        ``chunks`` (chunk ``i`` is the i-th box) of a tensor of ``shape``."""
        raise self.unsupported("checking a checkpoint's chunks")

    def checkpoint_load(
        self, shape: Sequence[int], chunks: Sequence[Box], tensor: Any
    ) -> tuple[Any, int]:
        """``dcp.load`` of a checkpoint whose chunks are ``chunks`` (of ``tensor``) through the
        implementation's load planner (:func:`load_through_planner`): the loaded tensor or the
        exception, and how many reads reached storage."""
        raise self.unsupported("loading a checkpoint through a load planner")

    def checkpoint_reads(
        self, shape: Sequence[int], saved: Sequence[Box], local: Sequence[Box]
    ) -> list[tuple[int, int, Box]]:
        """The reads the implementation's load planner makes to fill ``local`` from a
        checkpoint whose chunks are ``saved`` (CKPT-3): ``(saved index, local index, the
        region read, in global coordinates)``."""
        raise self.unsupported("planning checkpoint reads")
