"""``python -m conformance.gpu --bench``: the executor on one CUDA GPU, as ratios.

Runs with nothing but the machine's own CUDA torch (the checkout's ``packages/*/src`` are put
on the path where ``shardspec`` is not installed, as for the suite). Measured in one run:

* ``copy``: the device's own copy bandwidth, ``dst.copy_(src)`` of the same bytes (the floor);
* ``pack`` / ``unpack``: the executor's packing of a rank's pieces into its flat ``uint8``
  send buffer, and unpacking a receive buffer into the outputs (``executor._walk_round``),
  for a float32 matrix sent whole as column blocks: strided pieces, as in Shard(0)->Shard(1);
* ``reshard``: ``shardspec.reshard.reshard`` Shard(0)->Shard(1) of a float32 matrix, in the
  ranks of NCCL at world size 1 and of gloo ranks (2 and 4) sharing the GPU with CUDA
  tensors, beside ``DTensor.redistribute`` of the same tensor on the same mesh.

Every time is taken with ``torch.cuda`` events after warm-up iterations (warm buffers and
allocator); a collective's time is the slowest rank's per iteration; the median is reported.
Ratios are of times: ``pack/copy`` 2.0 means packing takes twice as long as copying the same
bytes; ``DTensor/ours`` above 1 means the executor is faster. Sizes that do not fit the free
GPU memory are skipped, saying so.

    python -m conformance.gpu --bench [--sizes 64M,256M,1G,4G] [--worlds 2,4]
                                      [--repeat 7] [--warmup 2] [--out bench.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_SIZES = (64 * MIB, 256 * MIB, GIB, 4 * GIB)
DEFAULT_WORLDS = (2, 4)
# Peak GPU bytes per byte of tensor: the pack/unpack holds a source, a buffer, a destination
# and (while checking) the expected bytes (4x); a resharding holds each rank's input, output
# and wire buffers, and DTensor's redistribute its own copies (about 5x, all ranks together).
LOCAL_FOOTPRINT = 4
RESHARD_FOOTPRINT = 6
# What each extra process costs on the GPU before any tensor: its CUDA context.
CONTEXT_BYTES = 1 * GIB
# Leave some free memory to the allocator's fragmentation and to other processes.
HEADROOM = 0.9
_UNITS = {"": 1, "K": 1 << 10, "M": MIB, "G": GIB, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"64M"``, ``"1G"``, ``"4096"`` (binary units; a trailing ``iB``/``B`` is
    allowed: ``"64MiB"``)."""
    s = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = s[-1:] if s[-1:] in _UNITS and s[-1:] else ""
    number = s[: len(s) - len(unit)]
    try:
        value = int(number)
    except ValueError:
        raise ValueError(f"size {text!r} is not a whole number of bytes, K, M, G or T") from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value * _UNITS[unit]


def format_size(nbytes: int) -> str:
    """``"64M"``, ``"4G"``, ``"1536K"``: the largest binary unit that divides ``nbytes``."""
    for unit in ("T", "G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def _size_list(text: str) -> list[int]:
    try:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    return sorted(set(sizes))


def _world_list(text: str) -> list[int]:
    try:
        worlds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"world sizes must be integers, got {text!r}") from None
    if any(w < 1 for w in worlds):
        raise argparse.ArgumentTypeError(f"world sizes must be >= 1, got {text!r}")
    return sorted(set(worlds))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options of ``--bench`` (``--bench`` itself already taken off by ``conformance.gpu``)."""
    p = argparse.ArgumentParser(
        prog="python -m conformance.gpu --bench",
        description="The executor on one CUDA GPU against the device's copy bandwidth and "
        "DTensor's redistribute, as ratios.",
    )
    default_sizes = ",".join(format_size(s) for s in DEFAULT_SIZES)
    p.add_argument(
        "--sizes",
        type=_size_list,
        default=list(DEFAULT_SIZES),
        help=f"tensor sizes, comma-separated (default {default_sizes})",
    )
    p.add_argument(
        "--worlds",
        type=_world_list,
        default=list(DEFAULT_WORLDS),
        help="gloo world sizes sharing the GPU (default 2,4); NCCL runs at world size 1",
    )
    p.add_argument("--repeat", type=_positive, default=7, help="timed iterations (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per method, world and size"
    )
    p.add_argument("--no-dtensor", action="store_true", help="leave DTensor out")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(list(argv))
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def matrix_shape(nbytes: int, itemsize: int = 4) -> tuple[int, int]:
    """A 2-d shape of about ``nbytes`` (at least one row): columns the power of two nearest
    the square root, so that both dimensions split evenly over 1, 2 and 4 ranks."""
    numel = max(nbytes // itemsize, 1)
    cols = 1 << max(round(math.log2(numel) / 2), 0)
    return max(numel // cols, 1), cols


def fit_sizes(
    sizes: Sequence[int], free_bytes: int, footprint: int, processes: int = 0
) -> tuple[list[int], list[int]]:
    """``(fitting, skipped)``: a size fits when ``footprint`` times it, plus a CUDA context
    per extra process, stays within ``HEADROOM`` of the free GPU memory."""
    budget = free_bytes * HEADROOM - processes * CONTEXT_BYTES
    fit = [s for s in sizes if s * footprint <= budget]
    return fit, [s for s in sizes if s not in fit]


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per iteration, the slowest rank's time: a collective is done when its last rank is."""
    if not per_rank:
        return []
    n = min(len(times) for times in per_rank)
    return [max(times[i] for times in per_rank) for i in range(n)]


def summarize(times_ms: Sequence[float], nbytes: int) -> dict[str, float]:
    """Median, min and max of the times, and the bandwidth the median gives for ``nbytes``."""
    if not times_ms:
        raise ValueError("no times to summarize")
    median = statistics.median(times_ms)
    gbps = nbytes / (median / 1e3) / 1e9 if median > 0 else math.inf
    return {
        "median_ms": median,
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "n": len(times_ms),
        "gbps": gbps,
    }


def ratio(num: dict[str, Any] | None, den: dict[str, Any] | None) -> float | None:
    """``num``'s median time over ``den``'s, or None when either was not measured."""
    if not num or not den or "median_ms" not in num or "median_ms" not in den:
        return None
    if den["median_ms"] <= 0:
        return None
    return float(num["median_ms"]) / float(den["median_ms"])


def _cell(stats: dict[str, Any] | None, key: str, fmt: str) -> str:
    if not stats:
        return "-"
    if "error" in stats:
        return "failed"
    return format(stats[key], fmt)


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]]


def render_table(result: dict[str, Any]) -> str:
    """The report of a run (the dict :func:`main` writes as JSON) as plain text."""
    out = [
        f"torch {result.get('torch', '?')}, CUDA {result.get('cuda', '?')}, "
        f"{result.get('device', '?')}; {format_size(int(result.get('free_bytes', 0)))} free",
        "times: median ms of cuda events; x/copy = time over a device copy of the same bytes",
        "",
    ]
    local = result.get("local", {})
    rows = []
    for size in sorted(local, key=int):
        m = local[size]
        rows.append(
            [
                format_size(int(size)),
                _cell(m.get("copy"), "gbps", ".1f"),
                _cell(m.get("pack"), "gbps", ".1f"),
                _num(ratio(m.get("pack"), m.get("copy"))),
                _cell(m.get("unpack"), "gbps", ".1f"),
                _num(ratio(m.get("unpack"), m.get("copy"))),
            ]
        )
    if rows:
        header = ["size", "copy GB/s", "pack GB/s", "pack/copy", "unpack GB/s", "unpack/copy"]
        out += _table(header, rows) + [""]
    rows = []
    for r in result.get("reshard", []):
        copy = local.get(str(r["size"]), {}).get("copy")
        ours, dtensor = r.get("ours"), r.get("dtensor")
        rows.append(
            [
                f"{r['backend']} W={r['world']}",
                format_size(int(r["size"])),
                _cell(ours, "median_ms", ".2f"),
                _num(ratio(ours, copy)),
                _cell(dtensor, "median_ms", ".2f"),
                _num(ratio(dtensor, ours)),
            ]
        )
    if rows:
        header = ["ranks", "size", "ours ms", "ours/copy", "DTensor ms", "DTensor/ours"]
        out += _table(header, rows) + [""]
    for r in result.get("reshard", []):
        for name in ("ours", "dtensor"):
            err = (r.get(name) or {}).get("error")
            if err:
                # a traceback's last line is the exception itself
                first = err.strip().splitlines()[-1].strip() if err.strip() else "?"
                out.append(
                    f"{r['backend']} W={r['world']} {format_size(r['size'])}: {name}: {first}"
                )
    for s in result.get("skipped", []):
        out.append(f"skipped {s['what']} {format_size(int(s['size']))}: {s['why']}")
    return "\n".join(out).rstrip() + "\n"


# -- on the GPU ---------------------------------------------------------------------------


def _time_cuda(
    fn: Callable[[], object],
    warmup: int,
    repeat: int,
    before: Callable[[], object] | None = None,
) -> list[float]:
    """Milliseconds of ``fn`` per iteration, by cuda events on the current stream (by the
    clock where there is no GPU: the meta test runs the rank code on CPU); ``before`` runs
    ahead of each iteration, untimed, with the device idle."""
    import time

    import torch

    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
            if cuda:
                torch.cuda.synchronize()
        if not cuda:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        # torch leaves Event's constructor untyped
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def packers(
    nbytes: int, device: str = "cuda"
) -> tuple[Callable[[], object], Callable[[], object], Callable[[], bool]]:
    """The executor's pack and unpack of one rank's pieces, and a check of the packed bytes.

    Rank 0 of five holds a float32 matrix whole and sends it to ranks 1-4 as column blocks
    (pack: every byte leaves as a strided piece); the reverse plan receives it back (unpack).
    The check packs and unpacks once and compares with slices of the matrix.
    """
    import torch

    from shardspec.metadata import chunk_layout
    from shardspec.reshard import executor as ex, schedule
    from shardspec.reshard.agreement import dtype_code

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    shape = matrix_shape(nbytes)
    whole = chunk_layout(shape, 0, [0])
    columns = chunk_layout(shape, 1, [1, 2, 3, 4])
    world = 5
    x = torch.randn(shape, device=dev)
    send, _ = ex._prepare("x", [x], whole, columns, 0, world, None, None, dev)
    recv, _ = ex._prepare("x", [], columns, whole, 0, world, {"x": torch.float32}, None, dev)
    ex._set_dtypes([send], [dtype_code(torch.float32)])
    ex._set_dtypes([recv], [dtype_code(torch.float32)])
    recv.outputs = [torch.empty(shape, device=dev)]
    sends = schedule.Streams([send], 0, world)
    recvs = schedule.Streams([recv], 0, world)
    send_q = schedule.quotas(sends.send_len, 1)
    recv_q = schedule.quotas(recvs.recv_len, 1)
    in_splits = schedule.windows(send_q, sends.send_len, 0)
    out_splits = schedule.windows(recv_q, recvs.recv_len, 0)
    buf = torch.empty(sum(in_splits), dtype=torch.uint8, device=dev)
    peers = list(range(world))

    def pack() -> None:
        ex._walk_round(sends.sends, [0] * world, send_q, in_splits, 0, buf, peers, pack=True)

    def unpack() -> None:
        ex._walk_round(recvs.recvs, [0] * world, recv_q, out_splits, 0, buf, peers, pack=False)

    def check() -> bool:
        pack()
        want = torch.cat(
            [
                x[:, b.offsets[1] : b.offsets[1] + b.sizes[1]].reshape(-1)
                for b in (s.box for s in columns.shards)
            ]
        )
        packed = torch.equal(buf.view(torch.float32), want)
        unpack()
        return packed and torch.equal(recv.outputs[0], x)

    return pack, unpack, check


def _copy_times(nbytes: int, warmup: int, repeat: int) -> list[float]:
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return _time_cuda(lambda: dst.copy_(src), warmup, repeat)


def measure_local(nbytes: int, warmup: int, repeat: int) -> dict[str, dict[str, Any]]:
    """Copy, pack and unpack of ``nbytes`` in this process."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    out["copy"] = summarize(_copy_times(nbytes, warmup, repeat), nbytes)
    torch.cuda.empty_cache()
    pack, unpack, check = packers(nbytes)
    if not check():
        raise AssertionError(f"the executor's pack/unpack of {format_size(nbytes)} is wrong")
    moved = math.prod(matrix_shape(nbytes)) * 4
    out["pack"] = summarize(_time_cuda(pack, warmup, repeat), moved)
    out["unpack"] = summarize(_time_cuda(unpack, warmup, repeat), moved)
    del pack, unpack, check
    gc.collect()  # the closures hold the matrix and buffers: free them before the ranks start
    torch.cuda.empty_cache()
    return out


METHODS = ("ours", "dtensor")


def rank_reshard(
    rank: int, world: int, nbytes: int, warmup: int, repeat: int, method: str
) -> list[float] | dict[str, str]:
    """On every rank: Shard(0)->Shard(1) of a float32 matrix by ``reshard`` (``"ours"``) or
    by DTensor's ``redistribute`` (``"dtensor"``); the per-iteration times (ms), or the error
    it raised. One method per call: a rank that crashes in one leaves the other's figures."""
    import traceback

    import torch
    import torch.distributed as dist

    from shardspec.metadata import chunk_layout
    from shardspec.reshard import reshard

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    shape = matrix_shape(nbytes)
    src = chunk_layout(shape, 0, list(range(world)))
    dst = chunk_layout(shape, 1, list(range(world)))
    (box,) = src.boxes_of(rank)
    (dbox,) = dst.boxes_of(rank)
    # Row i holds i (exact in float32 for these row counts): a misrouted block shows.
    rows = torch.arange(box.offsets[0], box.offsets[0] + box.sizes[0], device=dev)
    x = rows.to(torch.float32)[:, None].expand(*box.sizes).contiguous()
    want = torch.arange(shape[0], device=dev, dtype=torch.float32)[:, None].expand(*dbox.sizes)

    def timed(step: Callable[[], torch.Tensor]) -> list[float]:
        # Start together, untimed: otherwise a rank would time its wait for the others.
        times = _time_cuda(step, warmup, repeat, before=dist.barrier)
        if not torch.equal(step(), want):
            raise AssertionError(f"rank {rank}: {method} gave a wrong result")
        return times

    try:
        if method == "ours":
            return timed(lambda: reshard([x], src, dst)[0])
        if method != "dtensor":
            raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        mesh = init_device_mesh(dev.type, (world,))
        dt = DTensor.from_local(x, mesh, [Shard(0)], run_check=False)
        return timed(lambda: dt.redistribute(mesh, [Shard(1)]).to_local())
    except Exception:
        return {"error": traceback.format_exc(limit=3)}
    finally:
        if cuda:
            torch.cuda.empty_cache()


def _merge(answers: Sequence[Any], nbytes: int) -> dict[str, Any]:
    """One method's result over the ranks: the error of the first rank that failed, else the
    summary of the slowest rank per iteration."""
    per_rank = []
    for a in answers:
        if isinstance(a, dict):
            return a
        if not isinstance(a, list):  # a RankFailure, or what stopped the whole world
            return {"error": f"{type(a).__name__}: {getattr(a, 'message', a)}"}
        per_rank.append(a)
    return summarize(slowest_rank(per_rank), nbytes)


def measure_reshard(
    backend: str, world: int, nbytes: int, args: argparse.Namespace, device: str = "cuda"
) -> dict[str, Any]:
    """Both methods on one world of ranks sharing the GPU (NCCL only at world size 1);
    ``device="cpu"`` is for the meta test."""
    from shardspec.testing import RankPool

    entry: dict[str, Any] = {"backend": backend, "world": world, "size": nbytes}
    moved = math.prod(matrix_shape(nbytes)) * 4
    fn = "conformance.gpu.bench:rank_reshard"
    pool = RankPool(world, timeout=args.timeout, backend_name=backend, device=device)
    try:
        for method in METHODS if not args.no_dtensor else METHODS[:1]:
            try:
                answers = pool.call_all(
                    fn, nbytes, args.warmup, args.repeat, method, timeout=args.timeout
                )
            except Exception as e:  # a crashed or stuck world: say so; the pool restarts
                answers = [e] * world
            entry[method] = _merge(answers, moved)
    finally:
        pool.close()
    return entry


def _use_checkout() -> None:
    """Where shardspec is not installed, take it from this checkout, here and in the ranks."""
    from conformance.gpu.env import ROOT, gpu_env

    env = gpu_env()
    if "PYTHONPATH" in env:
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
        for path in reversed([p for p in env["PYTHONPATH"].split(os.pathsep) if p]):
            if path not in sys.path:
                sys.path.insert(0, path)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print(
            f"conformance.gpu --bench needs a CUDA GPU: torch {torch.__version__} sees none "
            f"(CUDA build: {torch.version.cuda or 'no'}); nothing was measured",
            file=sys.stderr,
        )
        return 1
    _use_checkout()
    torch.cuda.set_device(0)
    free, _total = torch.cuda.mem_get_info()
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "free_bytes": free,
        "sizes": list(args.sizes),
        "repeat": args.repeat,
        "warmup": args.warmup,
        "local": {},
        "reshard": [],
        "skipped": [],
    }

    def report(line: str) -> None:
        print(f"conformance.gpu --bench: {line}", flush=True)

    fit, skipped = fit_sizes(args.sizes, free, LOCAL_FOOTPRINT)
    for s in skipped:
        why = f"needs ~{format_size(s * LOCAL_FOOTPRINT)}, {format_size(free)} free"
        result["skipped"].append({"what": "copy/pack/unpack", "size": s, "why": why})
    for s in fit:
        report(f"copy, pack, unpack {format_size(s)}")
        result["local"][str(s)] = measure_local(s, args.warmup, args.repeat)
    torch.cuda.empty_cache()

    for backend, world in [("nccl", 1), *(("gloo", w) for w in args.worlds)]:
        free, _total = torch.cuda.mem_get_info()
        fit, skipped = fit_sizes(args.sizes, free, RESHARD_FOOTPRINT, processes=world)
        for s in skipped:
            why = f"needs ~{format_size(s * RESHARD_FOOTPRINT)} and {world} CUDA context(s)"
            what = f"reshard {backend} W={world}"
            result["skipped"].append({"what": what, "size": s, "why": f"{why}, {free >> 20}M free"})
        for s in fit:
            report(f"reshard {backend} W={world} {format_size(s)}")
            result["reshard"].append(measure_reshard(backend, world, s, args))

    print(render_table(result), end="")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
        report(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
