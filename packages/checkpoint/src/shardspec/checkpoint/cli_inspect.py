"""``shardspec inspect PATH``: what a DCP checkpoint holds, from its metadata and the sizes of
its files, without reading tensor data (CKPT-6, CKPT-8)."""

from __future__ import annotations

import argparse
import fnmatch
import json
from typing import Any, TextIO

from .cli_common import Checkpoint, add_progress_option, load, plural, size, span
from .report import TensorReport
from .saved_chunks import FileProblem, StoredFile, check_files

__all__ = ["LAYOUT_UP_TO", "add_parser", "run"]

LAYOUT_UP_TO = 20  # tensors; beyond this the pictures and chunk lists are left out by default


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="what a checkpoint holds, and whether its metadata and files are complete",
        description=(
            "Summary first (tensors, bytes, files, chunks, verdict), then each tensor by key: "
            "shape, dtype, bytes, chunk layout, the file of each chunk, the CKPT-1 verdict. "
            "Checks that every data file exists and is long enough for every byte range the "
            "metadata names; reads no tensor data (`shardspec verify` does). Exit 0 valid, "
            "1 invalid or a file missing or short, 2 unreadable."
        ),
    )
    p.add_argument("path", help="checkpoint directory (or its .metadata file)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--svg", metavar="FILE", help="draw the tensors' chunk layouts to FILE")
    p.add_argument(
        "--tensor",
        action="append",
        metavar="PATTERN",
        help="only tensors whose key matches this glob (repeatable)",
    )
    show = p.add_mutually_exclusive_group()
    show.add_argument(
        "--layout",
        dest="layout",
        action="store_true",
        default=None,
        help=f"draw each tensor's layout and list its chunks (the default up to {LAYOUT_UP_TO} "
        "tensors)",
    )
    show.add_argument(
        "--no-layout",
        dest="layout",
        action="store_false",
        help=f"one line per tensor (the default beyond {LAYOUT_UP_TO} tensors)",
    )
    add_progress_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    ck = load(args.path, args.progress)
    files, unlisted = check_files(ck.root, ck.tensors, ck.objects)
    tensors, objects = ck.tensors, ck.objects
    if args.tensor:
        tensors = [t for t in tensors if any(fnmatch.fnmatchcase(t.fqn, p) for p in args.tensor)]
        objects = [o for o in objects if any(fnmatch.fnmatchcase(o["fqn"], p) for p in args.tensor)]
    bad = [t for t in tensors if not t.ok]
    ok = not bad and all(f.ok for f in files) and not unlisted
    if args.svg:
        from .svg import reports_svg

        with open(args.svg, "w", encoding="utf-8") as svg:
            svg.write(reports_svg(tensors))
    if args.json:
        doc = {
            "path": args.path,
            "ok": ok,
            "summary": _summary(ck, tensors, objects, files, unlisted),
            "files": [f.to_dict() for f in files],
            "unlisted": [{"fqn": u.key, "chunk": u.chunk} for u in unlisted],
            "tensors": [t.to_dict() for t in tensors],
            "objects": objects,
        }
        json.dump(doc, out)
        out.write("\n")
    else:
        detail = args.layout if args.layout is not None else len(tensors) <= LAYOUT_UP_TO
        out.write(_headline(ck, tensors, objects, files, unlisted) + "\n")
        for sf in files:
            if sf.problem() is not None:
                out.write(f"  {sf.problem()}\n")
        for u in unlisted:
            out.write(f"  {u.message()}\n")
        out.write("\n")
        _print_tensors(tensors, objects, detail, out)
    return 0 if ok else 1


def _summary(
    ck: Checkpoint,
    tensors: list[TensorReport],
    objects: list[dict[str, Any]],
    files: list[StoredFile],
    unlisted: list[FileProblem],
) -> dict[str, Any]:
    return {
        "tensors": len(tensors),
        "bytes": sum(t.nbytes for t in tensors),
        "chunks": sum(len(t.chunks) for t in tensors),
        "objects": len(objects),
        "files": len(files),
        "file_bytes": sum(f.size or 0 for f in files),
        "invalid_tensors": sum(not t.ok for t in tensors),
        "missing_files": sum(f.size is None for f in files),
        "short_files": sum(f.size is not None and not f.ok for f in files),
        "unlisted": len(unlisted),
    }


def _headline(
    ck: Checkpoint,
    tensors: list[TensorReport],
    objects: list[dict[str, Any]],
    files: list[StoredFile],
    unlisted: list[FileProblem],
) -> str:
    s = _summary(ck, tensors, objects, files, unlisted)
    problems = [
        plural(s["invalid_tensors"], "invalid tensor") if s["invalid_tensors"] else "",
        plural(s["missing_files"], "missing file") if s["missing_files"] else "",
        plural(s["short_files"], "truncated file") if s["short_files"] else "",
        plural(s["unlisted"], "chunk in no file") if s["unlisted"] else "",
    ]
    problems = [p for p in problems if p]
    verdict = "INVALID: " + ", ".join(problems) if problems else "valid (metadata and file sizes)"
    return (
        f"{ck.path}: {plural(s['tensors'], 'tensor')} ({size(s['bytes'])}), "
        f"{plural(s['chunks'], 'chunk')}, {plural(s['objects'], 'other value')}, "
        f"{plural(s['files'], 'file')} ({size(s['file_bytes'])}); {verdict}"
    )


def _print_tensors(
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
            f"{t.fqn}  shape {t.shape}  {t.dtype}  {size(t.nbytes)}  "
            f"{plural(len(t.chunks), 'chunk')}  {verdict}\n"
        )
        if t.error is not None:
            out.write(f"  {t.error}\n")
        if not detail:
            continue
        if t.layout is not None:
            picture = t.layout.render().splitlines()[1:]  # the header repeats the shape
            out.write("".join(f"  {line}\n" for line in picture))
        for i, c in enumerate(t.chunks):
            region = ", ".join(map(span, c.offsets, c.sizes))
            where = f"{c.file} @ {c.file_offset}" if c.file is not None else "(no file named)"
            stored = f" ({size(c.stored_bytes)})" if c.stored_bytes is not None else ""
            out.write(f"  chunk #{i}  [{region}]  {where}{stored}\n")
        out.write("\n")
    for o in objects:
        out.write(f"{o['fqn']}  object  in {o['file']}\n")
