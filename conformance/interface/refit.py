"""The refit area: a training job's weights into a serving job's layout (REFIT-*:
spec/10-refit.md).

Its tests: ``conformance/tests/test_refit.py``. An adapter takes part by subclassing
:class:`Refit` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Refit(Adapter):
    """Refit from training layouts into serving layouts (REFIT-*: spec/10-refit.md)."""

    area = "refit"

    def refit(
        self,
        pool: Any,
        recipe: Any,
        rounds: list[dict[str, Any]],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        example: str,
    ) -> list[list[dict[str, list[Any]]]]:
        """Refit ``recipe`` (a :class:`shardspec.refit.Recipe`) on the pool's ranks, once per
        entry of ``rounds`` (full source tensors by name; from the second on, the same
        sources with new values, as after a training step): each rank starts with its boxes
        of every source in ``src`` (local order) and holds its boxes of every destination in
        ``dst`` (FP8 scales in their weight's blocks, ``shardspec.refit.scale_layout``). Per
        rank, per round, the destination tensors it holds by name (a rank that holds none of
        a name leaves it out), one tensor per box in local order."""
        raise self.unsupported("refit")

    def refit_on(
        self,
        pool: Any,
        members: list[int],
        recipe: Any,
        rounds: list[dict[str, Any]],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        example: str,
    ) -> list[list[dict[str, list[Any]]]]:
        """:meth:`refit` on the process group of ``members`` (pool ranks, ascending) alone:
        the layouts' ranks are ranks of that group (``members[i]`` is its rank ``i``); the
        pool's other ranks take no part. Per pool rank, per round, what it holds by name (a
        non-member nothing)."""
        raise self.unsupported("refit on a subgroup of the ranks")

    def refit_refused(
        self,
        pool: Any,
        recipe: Any,
        sources: dict[str, Any],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        fault: dict[str, Any],
        example: str,
    ) -> list[dict[str, Any]]:
        """REFIT-6 and REFIT-12: the refit of ``recipe`` (full ``sources`` by name, each rank
        its boxes of ``src``) into out= tensors of each rank's destination boxes filled with
        the byte 0xA5, where rank ``fault["rank"]`` alone passes something wrong (``kind``):
        ``shape``, its first box of source ``fault["name"]`` one row short (one row long
        when empty); ``missing``, that source left out; ``layout``, destination
        ``fault["name"]`` in the layout ``fault["layout"]`` instead; ``recipe``, its target
        ``fault["name"]`` renamed. Per rank ``{"error": the message of the RefitError it
        raised, or None, "untouched": whether its out= tensors hold only 0xA5}``."""
        raise self.unsupported("refit's refusals before data moves")

    def packed_layout(
        self,
        shape: tuple[int, ...],
        dim: int,
        part_sizes: list[int],
        ranks: list[int],
        unit: int,
        replicate: tuple[int, ...],
    ) -> Layout:
        """REFIT-3: the serving layout of a tensor packed from parts of ``part_sizes`` along
        ``dim`` under tensor parallelism over ``ranks``, as the implementation lays it out
        (vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear``): each rank's chunk of
        each part in whole ``unit``-element units, in part order; the parts in ``replicate``
        with fewer units than ranks replicated as vLLM replicates KV heads."""
        raise self.unsupported("packed serving layouts")
