"""The adapter interface, by area.

An implementation under test is an :class:`Adapter` subclass that also subclasses the areas
its library has, one small base class each (``conformance/interface/<area>.py``; each method
states its contract in its docstring and answers :class:`Unsupported` until overridden)::

    class MyChunks(Chunk):            # one area: an area class is an Adapter too
        name = "mychunks"
        def chunk_layout(self, shape, dim, ranks): ...

    class MyCheckpoints(Checkpoint, CheckpointFiles): ...   # several

A method of an area the adapter does not subclass answers :class:`Unsupported` ("takes no
part in the ... area"), so the report lists that area Unsupported, test by test.
:class:`Impl` subclasses every area at once: the built-in adapters use it, and so can an
adapter that prefers to override methods here and there.
"""

from __future__ import annotations

from conformance.interface.base import AREA_METHODS, AREA_TITLES, Adapter, KnownDefect, Unsupported
from conformance.interface.checkpoint import Checkpoint
from conformance.interface.checkpoint_files import CheckpointFiles
from conformance.interface.checkpoint_library import CheckpointLibrary
from conformance.interface.checkpoint_tools import CheckpointTools
from conformance.interface.chunk import Chunk
from conformance.interface.collective_load import CollectiveLoad
from conformance.interface.convert import Convert
from conformance.interface.dtensor import DTensorArea
from conformance.interface.flat import Flat
from conformance.interface.fsdp import Fsdp
from conformance.interface.hf_model import HfModel
from conformance.interface.refit import Refit
from conformance.interface.reshard import Reshard
from conformance.interface.serialize import Serialize
from conformance.interface.specs import Specs
from conformance.interface.torchrec import TorchRec
from conformance.interface.validation import Validation
from conformance.interface.zero_checkpoint import ZeroCheckpoint

__all__ = [
    "AREAS",
    "AREA_METHODS",
    "AREA_TITLES",
    "Adapter",
    "Checkpoint",
    "CheckpointFiles",
    "CheckpointLibrary",
    "CheckpointTools",
    "Chunk",
    "CollectiveLoad",
    "Convert",
    "DTensorArea",
    "Flat",
    "Fsdp",
    "HfModel",
    "Impl",
    "KnownDefect",
    "Refit",
    "Reshard",
    "Serialize",
    "Specs",
    "TorchRec",
    "Unsupported",
    "Validation",
    "ZeroCheckpoint",
]


class Impl(
    Validation,
    Chunk,
    Flat,
    DTensorArea,
    Specs,
    Serialize,
    Convert,
    Fsdp,
    Reshard,
    Refit,
    Checkpoint,
    CheckpointFiles,
    CollectiveLoad,
    CheckpointTools,
    CheckpointLibrary,
    ZeroCheckpoint,
    HfModel,
    TorchRec,
):
    """Every area at once; each method defaults to :class:`Unsupported`."""


# Every area the suite has, in the order the report lists them.
AREAS: tuple[str, ...] = Impl.areas()
