"""What the ``shardspec`` subcommands share: reading a checkpoint's reports, the progress bar,
sizes in words."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .dcp_metadata import metadata_path, read_metadata
from .report import TensorReport, object_reports, tensor_reports

__all__ = [
    "PROGRESS_FROM",
    "Checkpoint",
    "add_progress_option",
    "bar",
    "load",
    "size",
]

PROGRESS_FROM = 200  # tensors; fewer are read before a bar would be worth drawing


class Checkpoint:
    """A checkpoint's tensors (sorted by key), its other values and the directory its data
    files are relative to."""

    def __init__(
        self, path: str, root: Path, tensors: list[TensorReport], objects: list[dict[str, Any]]
    ) -> None:
        self.path = path
        self.root = root
        self.tensors = tensors
        self.objects = objects


def add_progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help=f"progress bar on stderr (auto: from {PROGRESS_FROM} tensors, on a terminal)",
    )


def bar(mode: str, total: int, desc: str, *, unit: str = "key", many: bool = False) -> Any:
    """A tqdm bar on stderr (``mode`` from ``--progress``). ``many``: the work is big enough
    for a bar whatever ``total`` is (auto mode then draws it on a terminal)."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    # disable=None: tqdm draws only on a terminal.
    disable: bool | None = {"always": False, "never": True}.get(mode)
    if mode == "auto" and total < PROGRESS_FROM and not many:
        disable = True
    scale = unit == "B"
    return tqdm(
        total=total, desc=desc, unit=unit, unit_scale=scale, file=sys.stderr, disable=disable
    )


def _wrap(mode: str, total: int, desc: str) -> Any:
    def wrap(items: Iterable[Any]) -> Iterable[Any]:
        b = bar(mode, total, desc)
        for x in items:
            yield x
            b.update(1)
        b.close()

    return wrap


def load(path: str, mode: str) -> Checkpoint:
    """The checkpoint at ``path`` (a directory or its ``.metadata`` file), from its metadata."""
    md = read_metadata(path, strict=False)  # a tensor's odd sizes: its verdict names them
    n = len(md.state_dict_metadata)
    tensors = sorted(tensor_reports(md, _wrap(mode, n, path)), key=lambda t: t.fqn)
    objects = sorted(object_reports(md), key=lambda o: str(o["fqn"]))
    return Checkpoint(path, metadata_path(path).parent, tensors, objects)


def span(offset: Any, size: Any) -> str:
    """A chunk's extent in one dim as saved, ``start:stop`` (a damaged one's may hold strings:
    shown as they are)."""
    numbers = (int, float)
    if isinstance(offset, numbers) and isinstance(size, numbers):
        return f"{offset}:{offset + size}"
    return f"{offset!r}+{size!r}"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
