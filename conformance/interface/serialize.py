"""The serialize area: the serialized layout form (CONVERT-8, CONVERT-9).

Its tests: ``conformance/tests/test_serialize.py``. An adapter takes part by subclassing
:class:`Serialize` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Serialize(Adapter):
    """The serialized layout form (CONVERT-8, CONVERT-9)."""

    area = "serialize"

    def layout_to_json(self, layout: Layout) -> str:
        """The layout as the spec's versioned JSON text."""
        raise self.unsupported("the serialized layout form")

    def layout_from_json(self, text: str | bytes) -> Layout:
        """The layout a JSON text holds; raises ``shardspec.metadata.LayoutError`` naming the
        JSON path of the bad field when the text is malformed."""
        raise self.unsupported("the serialized layout form")
