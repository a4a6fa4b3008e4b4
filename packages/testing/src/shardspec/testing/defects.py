"""Known defects as expected failures that say which failure they expect.

``xfail(strict=True)`` alone passes on any exception: a library that did not load, a typo in
the test, a different defect. :func:`known_failure` also names the exception type and a
pattern its message must match; the root ``conftest.py`` turns an expected failure whose
message does not match into a failure that shows both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["MATCH_MARK", "KnownFailure", "known_failure", "mismatch"]

F = TypeVar("F", bound=Callable[..., Any])
MATCH_MARK = "failure_matches"


class KnownFailure(tuple[Any, ...]):
    """The marks of one known defect: usable as a decorator, or as ``pytest.param(...,
    marks=known_failure(...))`` (a tuple of marks)."""

    def __new__(
        cls,
        reason: str,
        raises: type[BaseException] | tuple[type[BaseException], ...],
        match: str,
    ) -> KnownFailure:
        import pytest

        re.compile(match)  # a bad pattern fails where it is written, not when it is used
        marks = (
            pytest.mark.xfail(strict=True, raises=raises, reason=reason),
            getattr(pytest.mark, MATCH_MARK)(match),
        )
        return super().__new__(cls, marks)

    def __call__(self, fn: F) -> F:
        for mark in self:
            fn = mark(fn)
        return fn


def known_failure(
    reason: str,
    *,
    raises: type[BaseException] | tuple[type[BaseException], ...],
    match: str,
) -> KnownFailure:
    """A strict expected failure of a known defect: the test must raise ``raises`` with a
    message in which ``match`` (a regular expression) is found; any other failure, or a
    pass, fails the test."""
    return KnownFailure(reason, raises, match)


def mismatch(pattern: str, error: BaseException) -> str | None:
    """Why ``error`` is not the expected failure ``pattern`` describes, or None."""
    text = str(error)
    if re.search(pattern, text):
        return None
    shown = text if len(text) <= 2000 else text[:2000] + " ..."
    return (
        f"expected the known defect's failure (a message matching {pattern!r}), "
        f"got {type(error).__name__}: {shown}"
    )
