"""The checkpoint_library area: a checkpoint library's own save and load API (CKPT-19, CKPT-20):
answered by the peers.

Its tests: ``conformance/tests/test_checkpoint_libraries.py``. An adapter takes part by
subclassing :class:`CheckpointLibrary` (with its other areas); a method it does not override
answers :class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class CheckpointLibrary(Adapter):
    """A checkpoint library's own save and load API (CKPT-19, CKPT-20): answered by the peers."""

    area = "checkpoint_library"

    def checkpoint_written(self, pool: Any, layout: Layout, tensor: Any, path: str, ex: str) -> str:
        """Save a state dict of one ShardedTensor holding ``layout``'s boxes of ``tensor``
        (key ``"t"``) on the pool's ranks through the implementation's own checkpoint API,
        under directory ``path``; returns the directory holding its ``.metadata``."""
        raise self.unsupported("writing a checkpoint through its own checkpoint API")

    def checkpoint_model_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, dict[int, list[str]]]:
        """The FSDP area's uneven MLP (``shardspec.testing.fsdp_model``) after one Adam step,
        saved with its optimizer through the implementation's own checkpoint API as ``save``
        says (``kind`` "fsdp2" or "fsdp1", ``mesh``), loaded into a fresh model and optimizer
        as ``load`` says (``kind`` "fsdp2", "fsdp1" or "plain", ``mesh``). ``"load"``: per
        load rank, what differs from the saved full values (nothing: every value bit for
        bit); ``"save"``: per save rank, what DCP's full state dicts of the saved model and
        optimizer read differently after the save than before it (nothing)."""
        raise self.unsupported("saving and loading a model through its own checkpoint API")

    def checkpoint_damaged_load(
        self, save_pool: Any, load_pool: Any, damage: str, example: str
    ) -> dict[int, str]:
        """Save a small checkpoint through the implementation's own API on ``save_pool``,
        damage it (``damage``: "missing data file", "truncated data file", "no .metadata"),
        load it on ``load_pool``: per load rank, ``"refused: <its error>"``, ``"loaded"``, or
        ``"left waiting"`` (another rank failed and this one never returned)."""
        raise self.unsupported("loading a damaged checkpoint through its own checkpoint API")

    def checkpoint_extra_state(self, example: str) -> dict[str, Any]:
        """Save extra state (a step and NumPy's RNG state) beside a model through the
        implementation's own API and load it back on one rank: ``{"loaded": equal}`` or
        ``{"error": message}``."""
        raise self.unsupported("saving extra state through its own checkpoint API")

    def checkpoint_accepts_torch(self, release: str) -> bool:
        """Whether the implementation's own check of the torch release lets it save and
        load on ``release`` (e.g. "2.9.1")."""
        raise self.unsupported("a check of the torch release")

    def write_test_checkpoint(self, out: str) -> tuple[str, str]:
        """Rerun the generator of the small checkpoint of this implementation's own format
        that ``packages/checkpoint/tests/data`` holds, into ``out``: (the fresh checkpoint,
        the committed one), each a directory of ``model/`` and ``optimizer/``."""
        raise self.unsupported("a checkpoint of its own format in packages/checkpoint/tests/data")
