"""``shardspec diff A B``: what differs between two checkpoints: keys, shapes, dtypes and
chunk layouts from the metadata (CKPT-7), and with ``--values`` the tensors' values, chunk by
chunk (CKPT-10)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, TextIO

from .cli_common import Checkpoint, add_progress_option, bar, load, plural, span
from .report import TensorReport, diff_reports

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diff",
        help="keys, shapes, dtypes and layouts that differ; --values compares the data too",
        description=(
            "Without --values only the metadata is compared (the first line says so): keys, "
            "shapes, dtypes and chunk layouts. --values also reads both checkpoints' chunks "
            "(one chunk of each at a time, whatever their layouts) and lists each tensor whose "
            "values differ, with the largest difference and its global index, and each "
            "non-tensor value stored as different bytes (nothing is unpickled). Exit 0 same, "
            "1 different, 2 unreadable."
        ),
    )
    p.add_argument("a", help="first checkpoint")
    p.add_argument("b", help="second checkpoint")
    p.add_argument(
        "--values", action="store_true", help="compare the tensors' values too (reads the data)"
    )
    p.add_argument(
        "--atol", type=_tolerance, default=0.0, help="absolute tolerance for --values (default 0)"
    )
    p.add_argument(
        "--rtol", type=_tolerance, default=0.0, help="relative tolerance for --values (default 0)"
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_progress_option(p)
    p.set_defaults(run=run)


def _tolerance(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def run(args: argparse.Namespace, out: TextIO) -> int:
    if (args.atol or args.rtol) and not args.values:
        print("shardspec diff: --atol/--rtol apply to --values only", file=sys.stderr)
        return 2
    a, b = load(args.a, args.progress), load(args.b, args.progress)
    diffs = diff_reports(_side(a), _side(b))
    compared = "metadata and values" if args.values else "metadata only"
    if args.values:
        diffs += _value_diffs(a, b, args)
    if args.json:
        json.dump(
            {
                "a": args.a,
                "b": args.b,
                "compared": compared,
                "values_compared": bool(args.values),
                "atol": args.atol,
                "rtol": args.rtol,
                "same": not diffs,
                "differences": diffs,
            },
            out,
        )
        out.write("\n")
        return 1 if diffs else 0
    if args.values:
        tol = "exactly" if not (args.atol or args.rtol) else f"atol={args.atol} rtol={args.rtol}"
        out.write(f"compared metadata and values ({tol}) of {args.a} and {args.b}\n")
    else:
        out.write(
            f"compared metadata only (keys, shapes, dtypes, chunk layouts) of {args.a} and "
            f"{args.b}; --values compares the data\n"
        )
    for d in diffs:
        out.write(_line(d) + "\n")
    out.write(f"{plural(len(diffs), 'difference')}\n")
    return 1 if diffs else 0


def _side(ck: Checkpoint) -> dict[str, TensorReport | None]:
    side: dict[str, TensorReport | None] = {t.fqn: t for t in ck.tensors}
    side.update({o["fqn"]: None for o in ck.objects})
    return side


def _value_diffs(a: Checkpoint, b: Checkpoint, args: argparse.Namespace) -> list[dict[str, Any]]:
    from .value_diff import diff_tensor_values

    in_b = {t.fqn: t for t in b.tensors}
    pairs = [
        (ta, in_b[ta.fqn])
        for ta in a.tensors
        if ta.fqn in in_b
        and ta.ok
        and in_b[ta.fqn].ok
        and (ta.shape, ta.dtype) == (in_b[ta.fqn].shape, in_b[ta.fqn].dtype)
    ]
    total = sum(ta.nbytes for ta, _ in pairs)
    progress = bar(args.progress, total, "diff --values", unit="B", many=True)
    out = []
    for ta, tb in pairs:
        d = diff_tensor_values(
            a.root, ta, b.root, tb, atol=args.atol, rtol=args.rtol, on_chunk=progress.update
        )
        if d is not None:
            out.append(d.to_dict())
    progress.close()
    from .saved_chunks import same_stored_bytes

    objects_b = {o["fqn"]: o for o in b.objects}
    for oa in a.objects:
        ob = objects_b.get(oa["fqn"])
        if ob is not None and not same_stored_bytes(a.root, oa, b.root, ob):
            out.append({"fqn": oa["fqn"], "what": "object bytes"})
    # Tensors left out above differ in the metadata already (or are invalid: inspect says why).
    return out


def _line(d: dict[str, Any]) -> str:
    what = d["what"]
    if what in ("only in A", "only in B"):
        return f"{d['fqn']}: {what}"
    if what == "layout":
        return (
            f"{d['fqn']}: layout {d['a']} vs {d['b']}; chunks only in A: "
            f"{_boxes(d['only_in_a'])}; only in B: {_boxes(d['only_in_b'])}"
        )
    if what == "object bytes":
        return f"{d['fqn']}: non-tensor value stored as different bytes"
    if what == "values":
        return (
            f"{d['fqn']}: values differ in {d['count']} of {d['numel']} elements; largest "
            f"difference {d['max_diff']} at {tuple(d['where'])} ({d['a']} vs {d['b']})"
        )
    return f"{d['fqn']}: {what} {d['a']} vs {d['b']}"


def _boxes(boxes: list[dict[str, list[int]]], limit: int = 4) -> str:
    shown = ["[" + ", ".join(map(span, b["offsets"], b["sizes"])) + "]" for b in boxes[:limit]]
    more = f" and {len(boxes) - limit} more" if len(boxes) > limit else ""
    return (" ".join(shown) or "none") + more
