"""The one error refit raises."""

from __future__ import annotations

__all__ = ["RefitError"]


class RefitError(ValueError):
    """A recipe, a layout or a tensor that refit refuses; raised on every rank of the group,
    before any data moves, with the name of the tensor at fault."""
