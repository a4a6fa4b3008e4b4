"""The fsdp area: FSDP + TP state-dict boxes, chunking hooks and flattening (FSDP-*:
spec/07-fsdp.md).

Its tests: ``conformance/tests/test_fsdp.py``, ``conformance/tests/test_flatten.py``,
``conformance/tests/test_chunk.py``. An adapter takes part by subclassing :class:`Fsdp` (with
its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Box


class Fsdp(Adapter):
    """FSDP + TP state-dict boxes, chunking hooks and flattening (FSDP-*: spec/07-fsdp.md)."""

    area = "fsdp"

    def fsdp_local_boxes(self, pool: Any, tensor: Any, dim: int) -> list[tuple[Box, Any]]:
        """For a DTensor chunked on ``dim`` of a 1-D mesh of the pool's ranks: each rank's box as
        the FSDP state-dict path reports it, and the local tensor it really holds."""
        raise self.unsupported("FSDP boxes")

    def fsdp_tp_chunks(
        self, pool: Any, tensor: Any, mesh: Sequence[int], tp: list[Any], hook: str
    ) -> list[tuple[list[Box], Any]]:
        """FSDP + TP on a ``(dp, tp)`` mesh of the pool's ranks: per rank, the boxes the FSDP1
        state-dict hook (``hook`` = ``"dtensor"``: ``chunk_dtensor``; ``"tensor"``:
        ``chunk_tensor``) states for its chunk of its TP piece (TP placement ``tp``), and the
        data it holds."""
        raise self.unsupported("FSDP + TP state-dict hooks")

    def fsdp_tp_gathers(
        self, pool: Any, tensor: Any, mesh: Sequence[int], tp: list[Any]
    ) -> list[list[Any]]:
        """FSDP + TP as :meth:`fsdp_tp_chunks` with ``chunk_dtensor``, then gathered back along
        the FSDP dim: per rank, what ``all_gather_dtensor`` on the root mesh returns and what
        the implementation's optimizer-state path (where it has one) turns the same entry
        into. Each must be the rank's TP piece."""
        raise self.unsupported("FSDP + TP gathers")

    def fsdp_chunk_tensor(self, pool: Any, tensor: Any, example: str) -> list[Any]:
        """FSDP's ShardedTensor of a plain tensor's dim-0 chunks over the pool's ranks: per
        rank ``value["layout"]``, ``value["local"]`` and the local data."""
        return self._run_via(  # type: ignore[no-any-return]
            "FSDP chunking",
            pool,
            "fsdp.chunk_sharded_tensor",
            {},
            tensors=[tensor],
            example=example,
        )

    def fsdp_chunk_dtensor(self, pool: Any, tensor: Any, example: str) -> list[Any]:
        """FSDP1 + TP's chunk hook on a DTensor ``Shard(0)`` over every rank (FSDP over each
        rank alone): per rank ``value["outer"]`` / ``["inner"]`` layouts, ``["outer_local"]``,
        ``["inner_local"]`` and the inner local data."""
        return self._run_via(  # type: ignore[no-any-return]
            "FSDP + TP chunking", pool, "fsdp.chunk_dtensor", {}, tensors=[tensor], example=example
        )

    def flatten(
        self,
        pool: Any,
        mesh: Sequence[int],
        tp_dim: int,
        weight: Any,
        buf: Any,
        owners: Sequence[int],
        example: str,
    ) -> list[Any]:
        """FSDP-8 on a ``(dp, tp)`` mesh of the pool's ranks: a state dict whose ``layer.w`` is
        the implementation's FSDP1 ``chunk_tensor`` of ``weight`` TP-sharded on ``tp_dim``
        (nested ShardedTensors), ``layer.n`` a plain value and ``buf`` a ShardedTensor of
        ``buf``'s dim-0 chunks on ``owners`` only, flattened by the implementation. Per rank
        ``value["keys"]`` (the keys kept), ``value["entries"][key]`` (``layout`` JSON and
        ``local`` boxes of each ShardedTensor kept) and the local data, entries in key order."""
        args = {"mesh": list(mesh), "tp_dim": tp_dim, "owners": list(owners)}
        # The first example on a pool builds a 2-D mesh and its sub-groups, which on a loaded
        # machine takes longer than the per-example default; a hang is still caught.
        timeout = max(60.0, float(getattr(pool, "timeout", 0.0) or 0.0))
        return self._run_via(  # type: ignore[no-any-return]
            "flattening nested ShardedTensors",
            pool,
            "fsdp.flatten",
            args,
            tensors=[weight, buf],
            example=example,
            timeout=timeout,
        )
