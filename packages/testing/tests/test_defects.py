"""A known defect's expected failure names its failure: another exception, another message or
a pass fails the test (the root conftest's check of known_failure's pattern)."""

from __future__ import annotations

import builtins
import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardspec.testing.defects import known_failure, mismatch

ROOT = Path(__file__).resolve().parents[3]
# Python 3.10 has no exception groups of its own: Hypothesis's backport stands in
GROUP: Any = (
    getattr(builtins, "BaseExceptionGroup", None)
    or importlib.import_module("exceptiongroup").BaseExceptionGroup
)

CASES = """
import pytest
from shardspec.testing.defects import known_failure

try:
    ExceptionGroup
except NameError:  # Python 3.10: the backport Hypothesis raises there
    from exceptiongroup import ExceptionGroup

DEFECT = known_failure("upstream: off by one", raises=AssertionError, match=r"offset 2 != 3")

@DEFECT
def test_its_own_failure():
    assert 2 == 3, "offset 2 != 3"

@DEFECT
def test_another_message():
    assert 2 == 4, "offset 2 != 4"

@DEFECT
def test_another_exception():
    raise OSError("undefined symbol: _ZN3c1015report_overflowEPKc")

@DEFECT
def test_fixed():
    pass

# Hypothesis raises a group when it found several distinct failures
@DEFECT
def test_a_group_of_its_own_failures():
    raise ExceptionGroup("2", [AssertionError("offset 2 != 3"), AssertionError("offset 2 != 3 @1")])

@DEFECT
def test_a_group_with_another_failure():
    raise ExceptionGroup("2 bugs", [AssertionError("offset 2 != 3"), TypeError("harness: no arg")])

@DEFECT
def test_a_group_with_the_message_in_another_type():
    raise ExceptionGroup("2 bugs", [AssertionError("offset 2 != 3"), OSError("offset 2 != 3")])

@pytest.mark.parametrize("n", [pytest.param(3, marks=DEFECT), 2])
def test_as_a_param(n):
    assert n == 2, f"offset 2 != {n}"
"""


@pytest.mark.rule("CONF-14")
def test_only_the_defects_own_failure_is_expected(tmp_path: Path) -> None:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_cases.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = run.stdout.splitlines()

    def outcome(test: str) -> str:
        hits = [ln.split()[0] for ln in lines if f"test_cases.py::{test} " in f"{ln} "]
        assert len(hits) == 1, f"{test}: {hits}\n{run.stdout}"
        return hits[0]

    assert outcome("test_its_own_failure") == "XFAIL"
    assert outcome("test_another_message") == "FAILED"
    assert outcome("test_another_exception") == "FAILED"
    assert outcome("test_fixed") == "FAILED"  # strict: a pass is news
    assert outcome("test_a_group_of_its_own_failures") == "XFAIL"
    assert outcome("test_a_group_with_another_failure") == "FAILED"
    assert outcome("test_a_group_with_the_message_in_another_type") == "FAILED"
    assert outcome("test_as_a_param[3]") == "XFAIL"
    assert outcome("test_as_a_param[2]") == "PASSED"
    assert "a message matching 'offset 2 != 3'), got AssertionError: offset 2 != 4" in run.stdout
    assert "got TypeError (one of 2 in a group): harness: no arg" in run.stdout


@pytest.mark.rule("CONF-14")
def test_mismatch_names_the_pattern_and_the_failure() -> None:
    assert mismatch(r"size \d+ vs \d+", ValueError("size 80 vs 60")) is None
    why = mismatch(r"size \d+ vs \d+", OSError("undefined symbol"))
    assert why is not None and "OSError: undefined symbol" in why and "size" in why
    assert mismatch(r"size", OSError("size 1 vs 2"), raises=ValueError) is not None


@pytest.mark.rule("CONF-14")
def test_a_group_is_the_defect_only_when_every_member_is() -> None:
    both = GROUP("2", [ValueError("size 80 vs 60"), ValueError("size 8 vs 6")])
    assert mismatch(r"size \d+ vs \d+", both, raises=ValueError) is None
    nested = GROUP("2", [both, ValueError("size 1 vs 2")])
    assert mismatch(r"size \d+ vs \d+", nested, raises=ValueError) is None
    mixed = GROUP("2", [ValueError("size 80 vs 60"), ImportError("no torchrec")])
    why = mismatch(r"size \d+ vs \d+", mixed, raises=(ValueError, ImportError))
    assert why is not None and "ImportError (one of 2 in a group): no torchrec" in why


@pytest.mark.rule("CONF-14")
def test_a_bad_pattern_fails_where_it_is_written() -> None:
    import re

    with pytest.raises(re.error):
        known_failure("x", raises=ValueError, match="(")
