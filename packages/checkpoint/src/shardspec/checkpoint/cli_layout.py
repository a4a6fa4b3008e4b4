"""``shardspec layout FILE``: read a layout in the versioned JSON form
(:mod:`.serialize`), validate it and draw it. Needs no torch."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from shardspec.metadata.errors import LayoutError
from shardspec.metadata.serialize import layout_from_json

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "layout",
        help="validate and draw a layout JSON file (shardspec.layout, version 1)",
        description=(
            "Reads FILE ('-' for stdin) in the JSON form written by "
            "shardspec.metadata.layout_to_json, strictly (an unknown or missing key is named), "
            "validates it (bounds, overlap, coverage) and draws it. Exit 0 valid, 1 invalid, "
            "2 not a layout file."
        ),
    )
    p.add_argument("file", help="layout JSON file, or - for stdin")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.file == "-":
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    try:
        layout = layout_from_json(text)
    except LayoutError as e:
        print(f"shardspec layout: {args.file}: {e}", file=sys.stderr)
        return 2
    out.write(layout.render() + "\n")
    try:
        layout.validate()
    except LayoutError as e:
        out.write(f"INVALID: {e}\n")
        return 1
    out.write("valid\n")
    return 0
