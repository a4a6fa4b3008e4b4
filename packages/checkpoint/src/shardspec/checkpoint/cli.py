"""The ``shardspec`` command (also ``python -m shardspec.checkpoint``).

``shardspec inspect PATH`` summarises a DCP checkpoint (tensors, bytes, chunks, files, the
verdict), then lists each tensor by key: shape, dtype, bytes, the layout of its chunks drawn as
text, the file holding each chunk, and the CKPT-1 verdict. It reads the ``.metadata`` file
(with the restricted unpickler of :mod:`.dcp_metadata`) and the sizes of the data files, no
tensor data: it exits 1 when a tensor's chunks leave a gap, overlap or fall out of bounds, or
when a data file is missing or shorter than the byte ranges the metadata names in it.
``shardspec verify PATH`` also reads every saved chunk back, one at a time (CRC-32s, dtype,
shape) and names each bad one. ``shardspec diff A B`` lists the keys, shapes, dtypes and
layouts that differ (metadata only, and says so); ``--values`` compares the data too, chunk
by chunk, exact or within ``--atol/--rtol``. ``shardspec layout FILE`` validates and draws a
layout JSON file. ``shardspec reshard SRC DST`` rewrites a checkpoint offline into a target
job's chunk layout (:mod:`.offline`). Exit status: 0 fine, 1 invalid or different, 2 could not
read (or was refused, or torch is missing where a checkpoint needs it).

Each subcommand lives in its own module (``cli_<name>``, listed in :data:`COMMANDS`) with
``add_parser(subparsers)`` and ``run(args, out) -> int``; this module only parses and
dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import pickle
import sys
from collections.abc import Sequence

from .saved_chunks import ChunkDataError

__all__ = ["main"]

# subcommand -> module with add_parser() and run(), in the order of --help. Each is imported
# to build the parser, so a module's top level stays torch-free and cheap.
COMMANDS: dict[str, str] = {
    "inspect": "shardspec.checkpoint.cli_inspect",
    "verify": "shardspec.checkpoint.cli_verify",
    "diff": "shardspec.checkpoint.cli_diff",
    "layout": "shardspec.checkpoint.cli_layout",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardspec",
        description="Inspect, verify and compare DCP checkpoints; validate layout files.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    # Parsed by shardspec.checkpoint.offline (main() hands it the rest of the command line).
    sub.add_parser("reshard", help="rewrite a checkpoint into a target job's chunk layout")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reshard"]:
        return _reshard(argv[1:])
    args = _parser().parse_args(argv)
    try:
        rc: int = args.run(args, sys.stdout)
        return rc
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "torch":
            raise
        print(
            f"shardspec {args.command}: needs PyTorch to read DCP checkpoints, and it is not "
            "installed: pip install 'shardspec-checkpoint[torch]' (or torch itself)",
            file=sys.stderr,
        )
        return 2
    except (OSError, pickle.UnpicklingError, ChunkDataError) as e:
        print(f"shardspec {args.command}: {e}", file=sys.stderr)
        return 2


def _reshard(argv: list[str]) -> int:
    # imported when asked, as the other subcommands' work is: --help stays cheap
    from .offline import main as reshard_main

    return reshard_main(argv)
