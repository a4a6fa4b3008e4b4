"""The naive refit baseline, as training frameworks write it today: the training side calls
``full_tensor()`` on every source (here: every shard broadcast from its owner), and each
serving rank applies the recipe to the full tensors and slices its own boxes. It takes part
in the refit area only: slow and memory-hungry (every rank holds every full tensor), never
wrong, so it must pass, and it is what a faster refit is measured against."""

from __future__ import annotations

from typing import Any

from conformance.interface import Refit
from shardspec.metadata import Layout


class NaiveRefitImpl(Refit):
    name = "naive-refit"

    def version(self) -> str:
        return "baseline (conformance/ops/refit.py: refit.naive)"

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
        from conformance.impls.refit_wire import run_refit

        return run_refit(pool, "refit.naive", recipe, rounds, src, dst, example)
