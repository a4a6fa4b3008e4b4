"""Unsupported cases are counted and reported, never passed or dropped silently (CONF-4)."""

from __future__ import annotations

import pytest

from conformance.cases import TRACKER, case
from conformance.impls import Unsupported, get_impl
from shardspec.metadata import Layout

pytest_plugins = ["pytester"]


@pytest.mark.rule("CONF-4")
def test_torch_says_unsupported_for_replication() -> None:
    with pytest.raises(Unsupported, match=r"^unsupported by torch: ShardMetadata has no repl"):
        get_impl("torch").is_valid(Layout.replicated((2, 2), [0, 1]))


@pytest.mark.rule("CONF-4")
def test_case_counts_supported_and_unsupported_examples() -> None:
    TRACKER.reset()
    with case():
        raise Unsupported("unsupported by x: y")
    with case():
        pass
    assert TRACKER.supported == 1
    assert dict(TRACKER.unsupported) == {"unsupported by x: y": 1}
    with pytest.raises(ValueError, match="real"), case():
        raise ValueError("real failures are not swallowed")
    TRACKER.reset()


@pytest.mark.rule("CONF-4")
def test_an_all_unsupported_test_is_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("pytest_plugins = ['conformance.conftest']")
    pytester.makepyfile(
        """
        from hypothesis import given, settings, strategies as st
        from conformance.cases import case
        from conformance.impls import Unsupported

        @settings(max_examples=5, database=None)
        @given(st.integers())
        def test_never(n):
            with case():
                raise Unsupported("unsupported by torch: no way")

        @settings(max_examples=5, database=None)
        @given(st.integers())
        def test_sometimes(n):
            with case():
                if n % 2:
                    raise Unsupported("unsupported by torch: odd")
        """
    )
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*unsupported by torch: no way*"])
