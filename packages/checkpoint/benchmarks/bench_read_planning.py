"""Read planning: upstream DCP against ``shardspec.reshard.plan``, measured in the same run.

Two cases (spec/06-reshard.md, RESHARD-7), a ``(4n, 4n)`` float32 tensor saved as ``n``
chunks and loaded into other chunks, one per rank:

* ``rows -> cols``  ``n`` row chunks read as ``n`` column chunks. Every row meets every
  column, so the load has ``n * n`` reads whoever plans it; what differs is what a read costs.
* ``cols -> cols``  ``n`` column chunks read as ``n + 1`` column chunks shifted by 2 columns
  (boundaries at 2, 6, 10, ...). Only ``2n`` reads, but upstream's sweep runs along dim 0,
  where every chunk spans everything, so each rank still compares its chunk with all ``n``.

Per case and ``n``:

* ``upstream all``  ``create_read_items_for_chunk_list`` once per destination rank, every
  rank's read items kept (what a load plans across ranks; the coordinator's global plan
  holds them all),
* ``ours all``      ``plan(src, dst)``: the whole plan, every piece,
* ``upstream 1``    the call of one rank (rank ``n // 2``),
* ``ours 1``        ``plan(src, dst, rank=n // 2)``: the pieces that rank receives and also
  those it sends (DCP plans only the reads).

Each measurement runs in a fresh child process with a time limit (a slow case reports
``> limit``). Time: the "all" cases run once, the one-rank cases take the best of 5. Memory:
peak RSS growth of the child during the first run (VmHWM after, minus VmRSS before, with the
high-water mark reset first), after an untimed warm-up so imports are not counted. Layouts and
DCP chunk metadata are built before timing. Before anything is timed, the two planners are
checked to plan the same reads at n = 20 in both cases: the same (saved chunk, destination
chunk, overlap box) triples (tests/checkpoint_read_triples.py, also used by
tests/test_read_planning_equivalence.py).

    python packages/checkpoint/benchmarks/bench_read_planning.py             # rows -> cols to 1000
    python packages/checkpoint/benchmarks/bench_read_planning.py --max 2000  # both up to 2000
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.reshard import plan
from shardspec.testing.memory import peak_rss, reset_peak_rss, rss

SIZES = (250, 500, 1000, 2000)
CASES = ("rows -> cols", "cols -> cols")
# Upstream took 49 s and 3.3 GB for rows -> cols at n = 2000 here (2 cores shared with other
# jobs: over a minute under load), too much for a default run; cols -> cols is cheap enough.
DEFAULT_MAX = {"rows -> cols": 1000, "cols -> cols": 2000}
KINDS = ("upstream-all", "ours-all", "upstream-1", "ours-1")


# ---------------------------------------------------------------- child side


def layouts(case: str, n: int) -> tuple[Layout, Layout]:
    shape = (4 * n, 4 * n)
    if case == "rows -> cols":
        return chunk_layout(shape, 0, range(n)), chunk_layout(shape, 1, range(n))
    edges = [0, *range(2, 4 * n, 4), 4 * n]
    shifted = [(Box((0, a), (4 * n, b - a)), r) for r, (a, b) in enumerate(pairwise(edges))]
    return chunk_layout(shape, 1, range(n)), Layout.from_boxes(shape, shifted)


def expected_reads(case: str, n: int) -> int:
    return n * n if case == "rows -> cols" else 2 * n


def measure(kind: str, case: str, n: int) -> dict[str, Any]:
    """Time and peak memory of one planner on one case, in this (fresh) process."""
    src, dst = layouts(case, n)
    rank = n // 2
    if kind.startswith("upstream"):
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        from shardspec.metadata.dcp import to_chunk_list, to_tensor_storage_metadata

        md = to_tensor_storage_metadata(src)
        ranks = dst.ranks if kind == "upstream-all" else (rank,)
        chunks = [to_chunk_list(dst, r) for r in ranks]
        small = to_tensor_storage_metadata(layouts(case, 20)[0])
        create_read_items_for_chunk_list("w", small, chunks[0][:1])

        def prepare() -> None:
            pass  # it keeps nothing from one call to the next

        def run() -> int:
            out = [create_read_items_for_chunk_list("w", md, c) for c in chunks]
            return sum(map(len, out))

    else:
        plan(*layouts(case, 20))  # warm-up: NumPy and the planner's modules are imported here
        who = None if kind == "ours-all" else rank

        given = [(src, dst)]

        def prepare() -> None:
            # New layout objects before each clock: the planner keeps what it derives from a
            # layout while the layout lives, and a load plans each of its layouts once.
            given[0] = layouts(case, n)
            for layout in given[0]:
                layout.shards  # noqa: B018 (made now if it holds rows, as reps did; -O drops asserts)

        def run() -> int:
            return len(plan(*given[0], rank=who))

    repeats = 1 if kind.endswith("all") else 5
    gc.collect()
    reset_peak_rss()
    before = rss()
    t = time.perf_counter()
    count = run()
    best = time.perf_counter() - t
    peak = (peak_rss() or 0) - before
    for _ in range(repeats - 1):
        prepare()
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return {"seconds": best, "peak_bytes": peak, "count": count}


# ---------------------------------------------------------------- parent side


def in_child(kind: str, case: str, n: int, limit: float) -> dict[str, Any] | None:
    """``measure`` in a fresh process; None when it exceeds ``limit`` seconds (it is killed)."""
    cmd = [sys.executable, __file__, "--child", kind, case, str(n)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {case} n={n} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def check_equivalence(n: int = 20) -> None:
    """The two planners plan the same reads, else the tables below would compare nonsense."""
    from checkpoint_read_triples import our_triples, upstream_triples

    for case in CASES:
        src, dst = layouts(case, n)
        theirs = upstream_triples(src, dst)
        want = expected_reads(case, n)
        assert len(theirs) == want, f"{case}: upstream planned {len(theirs)} reads, not {want}"
        ours = our_triples(src, dst)
        assert ours == theirs, f"{case}: plans differ at n={n}: {len(ours ^ theirs)} triples"
        r = n // 2
        mine = our_triples(src, dst, rank=r)
        assert mine == {t for t in theirs if t[1][0] == r}, f"{case}: rank {r}'s plan differs"
        print(
            f"equivalence, {case}, n={n}: upstream and ours plan the same {len(theirs)} "
            f"(saved chunk, destination chunk, overlap box) triples (whole plan and rank {r})"
        )


def _secs(r: dict[str, Any] | None, limit: float) -> str:
    return f"> {limit:g} s" if r is None else f"{r['seconds']:.4f} s"


def _mib(r: dict[str, Any] | None) -> str:
    return "-" if r is None else f"{r['peak_bytes'] / 2**20:.1f} MiB"


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str, limit: float) -> str:
    if b is None:
        return "-"
    if a is None:  # upstream ran out of time: its time is at least the limit
        return f">{limit / b['seconds']:.0f}x" if key == "seconds" else "-"
    if b[key] <= 0:
        return "-"
    return f"{a[key] / b[key]:.1f}x"


def table(case: str, sizes: list[int], limit: float) -> None:
    print(f"\n{case}: (4n, 4n) float32; limit {limit:g} s per measurement")
    head = (
        f"{'n':>5} {'reads':>9} | {'upstream all':>21} {'ours all':>21} {'time':>6} {'mem':>5} "
        f"| {'upstream 1':>10} {'ours 1':>10} {'time':>6}"
    )
    print(head)
    print("-" * len(head))
    for n in sizes:
        r = {kind: in_child(kind, case, n, limit) for kind in KINDS}
        ua, oa, u1, o1 = (r[k] for k in KINDS)
        for name, res in (("upstream", ua), ("ours", oa)):
            if res is not None:
                assert res["count"] == expected_reads(case, n), (case, n, name, res["count"])
        both = f"{_secs(ua, limit)} {_mib(ua)}", f"{_secs(oa, limit)} {_mib(oa)}"
        print(
            f"{n:>5} {expected_reads(case, n):>9,} | {both[0]:>21} {both[1]:>21} "
            f"{_ratio(ua, oa, 'seconds', limit):>6} {_ratio(ua, oa, 'peak_bytes', limit):>5} "
            f"| {_secs(u1, limit):>10} {_secs(o1, limit):>10} "
            f"{_ratio(u1, o1, 'seconds', limit):>6}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--max", type=int, help="largest n for both cases (default: 1000 rows -> cols, 2000 cols)"
    )
    ap.add_argument("--limit", type=float, default=60.0, help="seconds per child (default 60)")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "CASE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, case, n = args.child[0], args.child[1], int(args.child[2])
        if kind not in KINDS or case not in CASES:
            raise SystemExit(f"unknown {kind!r} / {case!r}, expected one of {KINDS} / {CASES}")
        print(json.dumps(measure(kind, case, n)))
        return

    check_equivalence()
    for case in CASES:
        cap = DEFAULT_MAX[case] if args.max is None else args.max
        skipped = [n for n in SIZES if n > cap]
        if skipped:
            why = (
                "upstream needs about a minute and 3.3 GB at n=2000 on this machine"
                if args.max is None
                else f"above --max {args.max}"
            )
            print(f"{case}: skipped n={', '.join(map(str, skipped))} ({why}; --max to change)")
    for case in CASES:
        cap = DEFAULT_MAX[case] if args.max is None else args.max
        table(case, [n for n in SIZES if n <= cap], args.limit)
    print(
        "\nratios are upstream / ours (time: wall seconds; mem: peak RSS growth of the child). "
        "'ours 1' also plans what the rank sends."
    )


if __name__ == "__main__":
    main()
