"""The ``shardspec`` command (also ``python -m shardspec.metadata``).

``shardspec inspect PATH`` lists each tensor of a DCP checkpoint: shape, dtype, bytes, the
layout of its chunks drawn as text, the file holding each chunk, and the CKPT-1 verdict; it
exits 1 when a tensor's chunks leave a gap, overlap or fall out of bounds. ``--json`` prints
the same as JSON, ``--svg FILE`` draws the layouts. ``shardspec diff A B`` lists the tensors
whose shape, dtype or layout differ (exit 1 if any). Only the ``.metadata`` file is read,
with the restricted unpickler of :mod:`.dcp_metadata`. Exit status 2: the checkpoint could
not be read (or was refused).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import pickle
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from .checkpoint_report import TensorReport, diff_reports, object_reports, tensor_reports
from .dcp_metadata import read_metadata

__all__ = ["main"]

PROGRESS_FROM = 200  # tensors; fewer are read before a bar would be worth drawing


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardspec", description="Inspect and compare DCP checkpoints (metadata only)."
    )
    sub = p.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="what a checkpoint holds, and whether it is valid")
    ins.add_argument("path", help="checkpoint directory (or its .metadata file)")
    ins.add_argument("--json", action="store_true", help="print JSON for scripts")
    ins.add_argument("--svg", metavar="FILE", help="draw the tensors' chunk layouts to FILE")
    ins.add_argument(
        "--tensor",
        action="append",
        metavar="PATTERN",
        help="only tensors whose key matches this glob (repeatable)",
    )
    ins.add_argument(
        "--no-layout", action="store_true", help="leave out the pictures and chunk lists"
    )
    _progress_option(ins)
    dif = sub.add_parser("diff", help="tensors whose shape, dtype or layout differ")
    dif.add_argument("a", help="first checkpoint")
    dif.add_argument("b", help="second checkpoint")
    dif.add_argument("--json", action="store_true", help="print JSON for scripts")
    _progress_option(dif)
    # Parsed by shardspec.reshard.offline (main() hands it the rest of the command line).
    sub.add_parser("reshard", help="rewrite a checkpoint into a target job's chunk layout")
    return p


def _progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help=f"progress bar on stderr (auto: from {PROGRESS_FROM} tensors, on a terminal)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reshard"]:
        return _reshard(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "inspect":
            return _inspect(args, sys.stdout)
        return _diff(args, sys.stdout)
    except (OSError, pickle.UnpicklingError) as e:
        print(f"shardspec {args.command}: {e}", file=sys.stderr)
        return 2


def _reshard(argv: list[str]) -> int:
    # The reshard package depends on this one, not the other way: imported only when asked.
    try:
        from shardspec.reshard.offline import main as reshard_main
    except ImportError:
        print("shardspec reshard: needs shardspec-reshard installed", file=sys.stderr)
        return 2
    return reshard_main(argv)


def _bar(mode: str, total: int, desc: str) -> Any:
    def wrap(items: Iterable[Any]) -> Iterable[Any]:
        from tqdm import tqdm  # type: ignore[import-untyped]

        # disable=None: tqdm draws only on a terminal.
        disable: bool | None = {"always": False, "never": True}.get(mode)
        if mode == "auto" and total < PROGRESS_FROM:
            disable = True
        bar: Iterable[Any] = tqdm(
            items, total=total, desc=desc, unit="key", file=sys.stderr, disable=disable
        )
        return bar

    return wrap


def _load(path: str, mode: str) -> tuple[list[TensorReport], list[dict[str, Any]]]:
    md = read_metadata(path)
    n = len(md.state_dict_metadata)
    return list(tensor_reports(md, _bar(mode, n, path))), object_reports(md)


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    tensors, objects = _load(args.path, args.progress)
    if args.tensor:
        tensors = [t for t in tensors if any(fnmatch.fnmatchcase(t.fqn, p) for p in args.tensor)]
        objects = [o for o in objects if any(fnmatch.fnmatchcase(o["fqn"], p) for p in args.tensor)]
    bad = [t for t in tensors if not t.ok]
    if args.svg:
        from .svg import reports_svg

        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(reports_svg(tensors))
    if args.json:
        doc = {
            "path": args.path,
            "ok": not bad,
            "tensors": [t.to_dict() for t in tensors],
            "objects": objects,
        }
        json.dump(doc, out)
        out.write("\n")
    else:
        _print_text(tensors, objects, not args.no_layout, out)
    return 1 if bad else 0


def _print_text(
    tensors: list[TensorReport], objects: list[dict[str, Any]], detail: bool, out: TextIO
) -> None:
    if detail and tensors:
        out.write(
            "In the pictures, rN is chunk #N (a checkpoint does not record which rank "
            "wrote a chunk).\n\n"
        )
    for t in tensors:
        verdict = "OK" if t.error is None else f"INVALID ({t.error.kind})"
        out.write(
            f"{t.fqn}  shape {t.shape}  {t.dtype}  {_size(t.nbytes)}  "
            f"{len(t.chunks)} chunk{'s' if len(t.chunks) != 1 else ''}  {verdict}\n"
        )
        if t.error is not None:
            out.write(f"  {t.error}\n")
        if not detail:
            continue
        if t.layout is not None:
            picture = t.layout.render().splitlines()[1:]  # the header repeats the shape
            out.write("".join(f"  {line}\n" for line in picture))
        for i, c in enumerate(t.chunks):
            region = ", ".join(f"{o}:{o + s}" for o, s in zip(c.offsets, c.sizes))
            where = f"{c.file} @ {c.file_offset}" if c.file is not None else "(no file named)"
            stored = f" ({_size(c.stored_bytes)})" if c.stored_bytes is not None else ""
            out.write(f"  chunk #{i}  [{region}]  {where}{stored}\n")
        out.write("\n")
    for o in objects:
        out.write(f"{o['fqn']}  object  in {o['file']}\n")
    total = sum(t.nbytes for t in tensors)
    nbad = sum(not t.ok for t in tensors)
    out.write(
        f"{len(tensors)} tensors ({_size(total)}), {len(objects)} other values; "
        f"{'all valid' if not nbad else f'{nbad} INVALID'}\n"
    )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    sides = []
    for path in (args.a, args.b):
        tensors, objects = _load(path, args.progress)
        side: dict[str, TensorReport | None] = {t.fqn: t for t in tensors}
        side.update({o["fqn"]: None for o in objects})
        sides.append(side)
    diffs = diff_reports(sides[0], sides[1])
    if args.json:
        json.dump({"a": args.a, "b": args.b, "same": not diffs, "differences": diffs}, out)
        out.write("\n")
    else:
        for d in diffs:
            if d["what"] in ("only in A", "only in B"):
                out.write(f"{d['fqn']}: {d['what']}\n")
            elif d["what"] == "layout":
                out.write(
                    f"{d['fqn']}: layout {d['a']} vs {d['b']}; chunks only in A: "
                    f"{_boxes(d['only_in_a'])}; only in B: {_boxes(d['only_in_b'])}\n"
                )
            else:
                out.write(f"{d['fqn']}: {d['what']} {d['a']} vs {d['b']}\n")
        out.write(f"{len(diffs)} difference{'s' if len(diffs) != 1 else ''}\n")
    return 1 if diffs else 0


def _boxes(boxes: list[dict[str, list[int]]], limit: int = 4) -> str:
    shown = [
        "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(b["offsets"], b["sizes"])) + "]"
        for b in boxes[:limit]
    ]
    more = f" and {len(boxes) - limit} more" if len(boxes) > limit else ""
    return (" ".join(shown) or "none") + more
