"""JSON form speed: layout_to_json / layout_from_json against the floor, plain ``json``
on the same text (no checks, no Layout objects).

Layouts: 2-D grids of n boxes, n = 1e3 .. 1e5 (1e6 with --max-shards). Reported as ratios
ours / json measured in this run, so machine speed cancels out.

    python bench_serialize.py [--max-shards 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from bench_validate import grid  # the benchmarks' directory is on sys.path when run

from shardspec.metadata import layout_from_json, layout_to_dict, layout_to_json


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-shards", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args, _ = ap.parse_known_args()
    print("bench_serialize: shardspec JSON form vs plain json (same text), best of", args.repeat)
    print(f"{'shards':>9} {'write s':>9} {'x json':>7} {'read s':>9} {'x json':>7} {'MB':>6}")
    n = 1000
    while n <= args.max_shards:
        layout = grid(n)
        text = layout_to_json(layout)
        d = layout_to_dict(layout)
        w = best(lambda: layout_to_json(layout), args.repeat)  # noqa: B023
        w0 = best(lambda: json.dumps(d, separators=(",", ":")), args.repeat)  # noqa: B023
        r = best(lambda: layout_from_json(text), args.repeat)  # noqa: B023
        r0 = best(lambda: json.loads(text), args.repeat)  # noqa: B023
        print(
            f"{len(layout.shards):>9} {w:>9.4f} {w / w0:>7.2f} {r:>9.4f} {r / r0:>7.2f} "
            f"{len(text) / 1e6:>6.2f}"
        )
        n *= 10


if __name__ == "__main__":
    main()
