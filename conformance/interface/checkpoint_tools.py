"""The checkpoint_tools area: offline rewriting and value comparison of checkpoints (CKPT-7,
CKPT-10, CKPT-17).

Its tests: ``conformance/tests/test_checkpoint_tools.py``. An adapter takes part by subclassing
:class:`CheckpointTools` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class CheckpointTools(Adapter):
    """Offline rewriting and value comparison of checkpoints (CKPT-7, CKPT-10, CKPT-17)."""

    area = "checkpoint_tools"

    def checkpoint_offline(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        target: dict[str, Any],
        how: str,
        example: str,
    ) -> dict[str, Any]:
        """Offline rewriting (CKPT-17): a real ``dcp.save`` on ``save_pool``'s ranks of a
        ShardedTensor holding ``saved``'s boxes of ``tensor``; the implementation's offline
        rewriting of it into the chunk layout of ``target`` (as :meth:`checkpoint_round_trip`'s
        ``load``, its layout a Layout), given as ``how`` says: ``layouts`` (the layouts file
        the target job writes) or ``like`` (a checkpoint the target job saved, in which rank r
        saved its boxes of the target); then a plain ``dcp.load`` (DCP's own planner and
        reader) on ``load_pool``'s ranks into ``target``, every element filled with 1
        beforehand. Returns ``rc`` and ``stderr`` of the rewriting, ``chunks`` of the
        rewritten tensor and, with ``like``, ``like_chunks`` of that checkpoint (each a list
        of ``(Box, file)``), and ``loaded``: per load rank a RankResult whose tensors are its
        local tensors after the load."""
        raise self.unsupported("rewriting a checkpoint offline into another chunk layout")

    def checkpoint_diff_values(
        self,
        pool_a: Any,
        pool_b: Any,
        a: Layout,
        tensor_a: Any,
        b: Layout,
        tensor_b: Any,
        options: Sequence[str],
        example: str,
    ) -> dict[str, Any]:
        """``diff A B --values`` (CKPT-7, CKPT-10) of two checkpoints, each a real ``dcp.save``
        (A on ``pool_a`` of ``a``'s boxes of ``tensor_a``, B likewise) of one tensor ``t``,
        with ``options`` (``--atol``/``--rtol``): ``rc`` and ``out`` of the text report,
        ``json_rc`` and ``json`` of the ``--json`` one."""
        raise self.unsupported("comparing two checkpoints' values (diff --values)")
