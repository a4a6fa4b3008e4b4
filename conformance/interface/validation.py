"""The validation area: validation of a layout (LAYOUT-1..3, BOX-2: spec/01-layout.md).

Its tests: ``conformance/tests/test_validation.py``. An adapter takes part by subclassing
:class:`Validation` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from conformance.interface.base import Adapter
from shardspec.metadata import Layout


class Validation(Adapter):
    """Validation of a layout (LAYOUT-1..3, BOX-2: spec/01-layout.md)."""

    area = "validation"

    def is_valid(self, layout: Layout) -> bool:
        """True when the implementation's validator accepts ``layout``."""
        raise self.unsupported("validation")
