"""Small, fast runs of the benchmarks behind upstream's performance divergences.

The suite never asserts wall-clock time, so the report measures each performance defect in the
same run as a ratio against shardspec, at two sizes, and states how each side grows
(``growth``: the exponent e in time ~ n^e between the two sizes). Each probe reuses the
benchmark script's own layouts and measurement (``nox -s bench`` runs the full versions):

- ``validate-grid``: torch's ``validate_non_overlapping_shards_metadata`` against
  ``Layout.validate`` on square grids (``bench_validate.py``);
- ``dcp-read-planning``: ``create_read_items_for_chunk_list`` on every destination rank
  against one ``plan``, column chunks read as shifted column chunks (``bench_read_planning.py``;
  one rank's call alone is linear upstream, the load as a whole is not);
- ``dcp-save-plan-validation``: DCP's ``_validate_global_plan`` against ``Layout.validate`` on
  column chunks of a square tensor (its sweep runs along dim 0, which every chunk spans).

The third divergence, DTensor ``Shard(0) -> Shard(1)`` through all-gather, needs ranks: its
repro (``repros/dtensor-shard0-to-shard1-allgather.py``) prints the measurement.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _bench(package: str, name: str) -> ModuleType:
    """A benchmark script as a module, under its own name: the benchmarks time upstream in
    spawned children, which import the module again by that name."""
    folder = str(ROOT / "packages" / package / "benchmarks")
    if folder not in sys.path:
        sys.path.append(folder)
    return importlib.import_module(name)


@dataclass
class Probe:
    id: str
    rule: str
    what: str
    upstream: str | None
    sizes: list[int]
    torch_seconds: list[float | None]
    ours_seconds: list[float]
    limit: float

    def ratios(self) -> list[str]:
        return [
            f"> {self.limit / o:.0f}x" if t is None else f"{t / o:.1f}x"
            for t, o in zip(self.torch_seconds, self.ours_seconds)
        ]

    def growth(self) -> tuple[str, str]:
        n0, n1 = self.sizes[0], self.sizes[-1]
        t0, t1 = self.torch_seconds[0], self.torch_seconds[-1]
        o0, o1 = self.ours_seconds[0], self.ours_seconds[-1]
        theirs = "-" if t0 is None or t1 is None else f"{math.log(t1 / t0) / math.log(n1 / n0):.2f}"
        return theirs, f"{math.log(o1 / o0) / math.log(n1 / n0):.2f}"

    def as_json(self) -> dict[str, Any]:
        theirs, ours = self.growth()
        return {**vars(self), "ratios": self.ratios(), "growth": {"torch": theirs, "ours": ours}}


def validate_grid(sizes: tuple[int, ...] = (1024, 4096), limit: float = 30.0) -> Probe:
    bench = _bench("metadata", "bench_validate")
    torch_s, ours_s = [], []
    for n in sizes:
        layout = bench.grid(n)
        ours_s.append(bench.best_of(bench.quietly(layout.validate), n))
        torch_s.append(bench.upstream_seconds("grid", n, limit)[1])
    return Probe(
        "validate-grid",
        "LAYOUT-4",
        "validate_non_overlapping_shards_metadata vs Layout.validate, square grids of n shards",
        None,
        list(sizes),
        torch_s,
        ours_s,
        limit,
    )


def dcp_read_planning(sizes: tuple[int, ...] = (200, 800), limit: float = 120.0) -> Probe:
    bench = _bench("checkpoint", "bench_read_planning")
    case = "cols -> cols"
    torch_s: list[float | None] = []
    ours_s: list[float] = []
    for n in sizes:
        theirs = bench.in_child("upstream-all", case, n, limit)
        ours = bench.in_child("ours-all", case, n, limit)
        torch_s.append(None if theirs is None else theirs["seconds"])
        ours_s.append(math.inf if ours is None else ours["seconds"])
    return Probe(
        "dcp-read-planning",
        "RESHARD-7",
        "create_read_items_for_chunk_list on every rank vs one plan(): n column chunks read "
        "as n + 1 shifted by 2 columns",
        "pytorch#169113",
        list(sizes),
        torch_s,
        ours_s,
        limit,
    )


def _best(fn: Any, repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if best > 0.5:  # slow enough that one run is well above the noise
            break
    return best


def dcp_save_plan_validation(sizes: tuple[int, ...] = (250, 1000)) -> Probe:
    from torch.distributed.checkpoint.default_planner import _validate_global_plan
    from torch.distributed.checkpoint.metadata import Metadata

    from shardspec.metadata import chunk_layout
    from shardspec.metadata.dcp import to_tensor_storage_metadata

    torch_s: list[float | None] = []
    ours_s: list[float] = []
    for n in sizes:
        layout = chunk_layout((4 * n, 4 * n), 1, range(n))
        md = Metadata(state_dict_metadata={"w": to_tensor_storage_metadata(layout)})
        torch_s.append(_best(lambda md=md: _validate_global_plan([], md)))
        ours_s.append(_best(lambda layout=layout: layout.validate()))
    return Probe(
        "dcp-save-plan-validation",
        "LAYOUT-4",
        "DCP _validate_global_plan vs Layout.validate, n column chunks of a (4n, 4n) tensor",
        "pytorch#163548",
        list(sizes),
        torch_s,
        ours_s,
        math.inf,
    )


PROBES = (validate_grid, dcp_read_planning, dcp_save_plan_validation)


def run_all() -> list[Probe]:
    return [probe() for probe in PROBES]


if __name__ == "__main__":
    for p in run_all():
        theirs, ours = p.growth()
        print(f"{p.id}: n={p.sizes} torch/ours {p.ratios()} growth torch {theirs} ours {ours}")
