"""``shardspec verify PATH``: everything ``inspect`` checks, then every saved chunk read back,
one at a time, against the dtype and shape its metadata gives (CKPT-9)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from .cli_common import add_progress_option, bar, load, plural, size
from .saved_chunks import ChunkDataError, check_files, read_saved_chunk

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="read every saved chunk back and check it against the metadata",
        description=(
            "Checks what `inspect` checks, then reads every saved chunk, one at a time: its "
            "torch.save archive's CRC-32s, and that it loads as the dtype and shape the "
            "metadata gives. Exit 0 when all hold, 1 naming each bad chunk (file, tensor key, "
            "chunk offsets), 2 when the metadata cannot be read."
        ),
    )
    p.add_argument("path", help="checkpoint directory (or its .metadata file)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_progress_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    ck = load(args.path, args.progress)
    files, unlisted = check_files(ck.root, ck.tensors, ck.objects)
    problems: list[dict[str, Any]] = []
    for f in files:
        if not f.ok:
            problems.append({"what": "file", **f.to_dict(), "message": f.problem()})
    for u in unlisted:
        problems.append(
            {"what": "unlisted", "fqn": u.key, "chunk": u.chunk, "message": u.message()}
        )
    for t in ck.tensors:
        if t.error is not None:
            problems.append({"what": "chunks", "fqn": t.fqn, "message": str(t.error)})
    total = sum(c.stored_bytes or 0 for t in ck.tensors for c in t.chunks)
    nchunks = 0
    progress = bar(args.progress, total, f"verify {args.path}", unit="B", many=True)
    for t in ck.tensors:
        for i, c in enumerate(t.chunks):
            nchunks += 1
            try:
                read_saved_chunk(ck.root, t, i)
            except ChunkDataError as e:
                problems.append(
                    {
                        "what": "data",
                        "file": e.file,
                        "fqn": e.key,
                        "chunk": e.chunk,
                        "offsets": list(e.offsets),
                        "message": str(e),
                    }
                )
            progress.update(c.stored_bytes or 0)
    progress.close()
    ok = not problems
    if args.json:
        json.dump(
            {
                "path": args.path,
                "ok": ok,
                "tensors": len(ck.tensors),
                "chunks": nchunks,
                "bytes": total,
                "problems": problems,
            },
            out,
        )
        out.write("\n")
    else:
        verdict = "all valid" if ok else f"{plural(len(problems), 'problem')}"
        out.write(
            f"{args.path}: read {plural(nchunks, 'chunk')} of "
            f"{plural(len(ck.tensors), 'tensor')} ({size(total)} stored); {verdict}\n"
        )
        for p in problems:
            out.write(f"  {p['message']}\n")
    return 0 if ok else 1
