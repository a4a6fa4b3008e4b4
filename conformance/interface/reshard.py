"""The reshard area: resharding on ranks (RESHARD-*: spec/06-reshard.md).

Its tests: ``conformance/tests/test_reshard.py``,
``conformance/tests/test_reshard_agreement.py``. An adapter takes part by subclassing
:class:`Reshard` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Reshard(Adapter):
    """Resharding on ranks (RESHARD-*: spec/06-reshard.md)."""

    area = "reshard"

    def reshard(
        self,
        pool: Any,
        src: Layout,
        dst: Layout,
        tensor: Any,
        *,
        max_buffer_bytes: int | None = None,
        noncontig: bool = False,
        example: str | None = None,
    ) -> list[Any]:
        """Move ``tensor`` (global) from layout ``src`` to ``dst`` on the pool's ranks: each
        rank starts with its source boxes and returns a RankResult whose tensors are its
        destination boxes in ``dst``'s local order."""
        raise self.unsupported("resharding")

    def reshard_state_dict(
        self, pool: Any, entries: list[dict[str, Any]], budget: int | None, example: str
    ) -> list[Any]:
        """Move several tensors at once (``entries``: ``key``, ``src``, ``dst``, global
        ``tensor``, ``out``: a kind of ``strategies.streams.OUT_KINDS`` or None, ``pad``) on the
        pool's ranks: per rank a RankResult whose tensors are its destination boxes of every
        entry in order, and whose ``value`` says per key whether the out= tensors given were
        returned (``same``) and whether anything outside them was written (``spilled``)."""
        raise self.unsupported("resharding a state dict of several dtypes")

    def reshard_state_dict_on(
        self,
        pool: Any,
        members: list[int],
        entries: list[dict[str, Any]],
        budget: int | None,
        example: str,
    ) -> list[Any]:
        """:meth:`reshard_state_dict` on the process group of ``members`` (pool ranks,
        ascending) alone: the layouts' ranks are ranks of that group (``members[i]`` is its
        rank ``i``); the pool's other ranks take no part. A RankResult per pool rank, a
        non-member's with no tensors."""
        raise self.unsupported("resharding on a subgroup of the ranks")

    def reshard_checked(
        self,
        pool: Any,
        entries: list[dict[str, Any]],
        *,
        api: str,
        copies: dict[int, dict[str, dict[str, Layout]]] | None = None,
        inputs: list[list[Any]] | None = None,
        check_replicas: bool = False,
        out: bool = False,
        noncontig: bool = False,
        example: str,
    ) -> list[Any]:
        """The executor's collective checks (RESHARD-5, RESHARD-13): ``reshard`` of the one
        entry (``api`` ``reshard``) or ``reshard_state_dict`` of every entry (``key``,
        ``src``, ``dst``, global ``tensor``) with ``check_replicas``, where rank r passes
        ``copies[r][key]["src"/"dst"]`` instead of an entry's layouts, and as its source
        shards ``inputs[r]`` (every entry's boxes of r in order; by default the slices of the
        global tensors its own layouts give), strided when ``noncontig``; with ``out``, into
        out= tensors of its own destination boxes, filled with a sentinel byte. Per rank a
        RankResult: ``value["error"]`` (the ReshardError it raised, or None),
        ``value["untouched"]`` (whether its out= tensors still hold only the sentinel after
        an error; None without out=) and its destination shards of every entry when it
        returned."""
        raise self.unsupported(
            "the executor's collective checks before data moves (agreement, check_replicas)"
        )
