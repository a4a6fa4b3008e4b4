"""shardspec.checkpoint: everything that reads or writes checkpoint files.

* :mod:`.dcp` — DCP's ``LoadPlanner`` and ``SavePlanner`` that check every saved tensor's chunks
  (CKPT-1) before data moves, and plan reads with :func:`shardspec.reshard.plan`.
* :mod:`.dcp_reader` — ``FileSystemReader``: each saved byte a rank needs read at most once.
* :mod:`.collective_load` — :func:`load`: a collective load that owns its protocol (metadata
  read once, reads ``"own"`` or ``"once"``, the rest moved by the reshard executor);
  :mod:`.load_reads` decides who reads what.
* :mod:`.offline` — ``shardspec reshard``: a checkpoint rewritten into another job's layout.
* :mod:`.safetensors_files` — a Hugging Face safetensors checkpoint's headers, checked, as
  DCP's ``Metadata`` (one chunk per tensor) for the collective load.
* :mod:`.cli` — the ``shardspec`` command: inspect, verify, diff, layout, reshard.
* :mod:`.chunks`, :mod:`.dcp_metadata`, :mod:`.report`, :mod:`.saved_chunks`,
  :mod:`.value_diff` — the chunk check, the restricted ``.metadata`` reader, per-tensor reports,
  the data files checked against the metadata, and values compared across layouts.

Importing this package does not import torch; the planners and the reader load it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardspec.metadata.lazy import lazy_exports

from .chunks import ChunkError, check_chunks

if TYPE_CHECKING:  # the lazy names, typed for mypy and editors
    from .collective_load import LoadError as LoadError, LoadStats as LoadStats, load as load
    from .dcp import (
        LoadPlanner as LoadPlanner,
        SavePlanner as SavePlanner,
        chunk_error as chunk_error,
        read_error as read_error,
    )
    from .dcp_reader import (
        CheckpointReadError as CheckpointReadError,
        FileSystemReader as FileSystemReader,
    )

# name -> submodule that defines it; these import torch.
_LAZY: dict[str, str] = {
    "LoadPlanner": "dcp",
    "SavePlanner": "dcp",
    "chunk_error": "dcp",
    "read_error": "dcp",
    "FileSystemReader": "dcp_reader",
    "CheckpointReadError": "dcp_reader",
    # not a module named "load": importing it would set the package's "load" to the module
    "load": "collective_load",
    "LoadError": "collective_load",
    "LoadStats": "collective_load",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = ["ChunkError", "check_chunks", *_LAZY]
