"""Known defects as expected failures that say which failure they expect.

``xfail(strict=True)`` alone passes on any exception: a library that did not load, a typo in
the test, a different defect. :func:`known_failure` also names the exception type and a
pattern its message must match; the root ``conftest.py`` turns an expected failure whose
message does not match into a failure that shows both.

Hypothesis raises an ``ExceptionGroup`` when it found several distinct failures: such a group
is the known defect only when every exception in it is (each of the expected type, each
message matching), so that a defect beside an unrelated error still fails.
"""

from __future__ import annotations

import builtins
import importlib
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["MATCH_MARK", "KnownFailure", "known_failure", "mismatch", "xfail_raises"]

F = TypeVar("F", bound=Callable[..., Any])
MATCH_MARK = "failure_matches"
Raises = type[BaseException] | tuple[type[BaseException], ...]
# Python 3.10 has no exception groups of its own; Hypothesis raises its backport's there
_GROUP = cast(
    type[BaseException],
    getattr(builtins, "BaseExceptionGroup", None)
    or importlib.import_module("exceptiongroup").BaseExceptionGroup,
)


def xfail_raises(raises: Raises | None) -> tuple[type[BaseException], ...] | None:
    """What to give ``xfail(raises=...)``: ``raises`` and an exception group, whose members
    :func:`mismatch` checks one by one (pytest's own check sees only the group's type)."""
    if raises is None:
        return None
    kinds = raises if isinstance(raises, tuple) else (raises,)
    return (*kinds, _GROUP)


class KnownFailure(tuple[Any, ...]):
    """The marks of one known defect: usable as a decorator, or as ``pytest.param(...,
    marks=known_failure(...))`` (a tuple of marks)."""

    def __new__(
        cls,
        reason: str,
        raises: Raises,
        match: str,
    ) -> KnownFailure:
        import pytest

        re.compile(match)  # a bad pattern fails where it is written, not when it is used
        marks = (
            pytest.mark.xfail(strict=True, raises=xfail_raises(raises), reason=reason),
            getattr(pytest.mark, MATCH_MARK)(match, raises=raises),
        )
        return super().__new__(cls, marks)

    def __call__(self, fn: F) -> F:
        for mark in self:
            fn = mark(fn)
        return fn


def known_failure(
    reason: str,
    *,
    raises: Raises,
    match: str,
) -> KnownFailure:
    """A strict expected failure of a known defect: the test must raise ``raises`` with a
    message in which ``match`` (a regular expression) is found; any other failure, or a
    pass, fails the test."""
    return KnownFailure(reason, raises, match)


def _leaves(error: BaseException) -> list[BaseException]:
    inner = getattr(error, "exceptions", None) if isinstance(error, _GROUP) else None
    if inner is not None:
        return [leaf for e in inner for leaf in _leaves(e)]
    return [error]


def mismatch(pattern: str, error: BaseException, raises: Raises | None = None) -> str | None:
    """Why ``error`` is not the expected failure (of type ``raises``, with a message in which
    ``pattern`` is found), or None; an exception group must be that failure in every member."""
    for leaf in _leaves(error):
        text = str(leaf)
        if (raises is None or isinstance(leaf, raises)) and re.search(pattern, text):
            continue
        kinds = raises if isinstance(raises, tuple) else (raises,) if raises else ()
        wanted = " or ".join(k.__name__ for k in kinds) or "an exception"
        shown = text if len(text) <= 2000 else text[:2000] + " ..."
        within = f" (one of {len(_leaves(error))} in a group)" if leaf is not error else ""
        return (
            f"expected the known defect's failure ({wanted} with a message matching "
            f"{pattern!r}), got {type(leaf).__name__}{within}: {shown}"
        )
    return None
