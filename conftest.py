"""Settings shared by every test in the monorepo."""

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# deadline=None: distributed examples and first-call imports vary too much in time for a
# per-example deadline to mean anything. `HYPOTHESIS_PROFILE=thorough` for a long hunt.
settings.register_profile(
    "default",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Fewer examples, derandomized: simulated worlds of up to 1024 ranks (`nox -s
# conformance_scale`) cost seconds per example, and CI's launched run repeats the suite.
settings.register_profile(
    "short",
    max_examples=int(os.environ.get("SHARDSPEC_EXAMPLES", "12")),
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
# CI runs derandomized so that a red run is reproducible and never a coin toss.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "failure_matches(pattern, raises=None): the expected failure of a known defect must be "
        "a `raises` whose message matches pattern, every one of an exception group "
        "(shardspec.testing.defects.known_failure)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[Any]:
    # xfail(raises=...) checks the exception's type, or lets an exception group through; the
    # message, and each member of a group, is checked here, so that a known defect is only
    # "reproduced" by its own failure
    report = yield
    mark = item.get_closest_marker("failure_matches")
    if mark is None or call.when != "call" or call.excinfo is None:
        return report
    if not hasattr(report, "wasxfail"):
        return report
    from shardspec.testing.defects import mismatch

    why = mismatch(mark.args[0], call.excinfo.value, mark.kwargs.get("raises"))
    if why is not None:
        del report.wasxfail
        report.outcome = "failed"
        report.longrepr = f"{why}\n\n{report.longrepr}"
    return report
