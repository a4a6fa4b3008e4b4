"""A known defect's expected failure names its failure: another exception, another message or
a pass fails the test (the root conftest's check of known_failure's pattern)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardspec.testing.defects import known_failure, mismatch

ROOT = Path(__file__).resolve().parents[3]

CASES = """
import pytest
from shardspec.testing.defects import known_failure

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
    assert outcome("test_as_a_param[3]") == "XFAIL"
    assert outcome("test_as_a_param[2]") == "PASSED"
    assert "a message matching 'offset 2 != 3'), got AssertionError: offset 2 != 4" in run.stdout


@pytest.mark.rule("CONF-14")
def test_mismatch_names_the_pattern_and_the_failure() -> None:
    assert mismatch(r"size \d+ vs \d+", ValueError("size 80 vs 60")) is None
    why = mismatch(r"size \d+ vs \d+", OSError("undefined symbol"))
    assert why is not None and "OSError: undefined symbol" in why and "size" in why


@pytest.mark.rule("CONF-14")
def test_a_bad_pattern_fails_where_it_is_written() -> None:
    import re

    with pytest.raises(re.error):
        known_failure("x", raises=ValueError, match="(")
