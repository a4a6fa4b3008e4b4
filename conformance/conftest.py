"""pytest wiring for the conformance suite.

- ``--impl`` (or ``SHARDSPEC_IMPL``) picks the implementation under test; ``--pool-timeout``
  (or ``SHARDSPEC_POOL_TIMEOUT``) the per-example timeout of the rank pool.
- ``@pytest.mark.known_defect(impl, reason, issue=None, raises=None, match=None)`` on a test
  turns into ``xfail(strict=True, raises=raises)`` when that implementation is under test,
  whose failure must match ``match`` (CONF-14); of an exception group (Hypothesis found
  several failures), every member must.
- Tests whose every example was unsupported are skipped with "unsupported by <impl>: ...".
- Under ``SHARDSPEC_BACKEND=nccl`` without enough GPUs every pool test skips with the reason.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# The suite is imported as the package `conformance` from the repository root, also when pytest
# is started as `pytest` (whose sys.path[0] is not the working directory).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from conformance.cases import TRACKER  # noqa: E402
from conformance.impls import IMPLS, Impl, get_impl  # noqa: E402

collect_ignore = ["bench_pool.py", "report.py"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardspec conformance")
    group.addoption(
        "--impl",
        choices=IMPLS,
        default=None,
        help="implementation under test (default: $SHARDSPEC_IMPL or shardspec)",
    )
    group.addoption(
        "--pool-timeout",
        type=float,
        default=None,
        help="seconds a rank may take per example before the pool is restarted "
        "(default: $SHARDSPEC_POOL_TIMEOUT or 10)",
    )


def pytest_configure(config: pytest.Config) -> None:
    impl = config.getoption("--impl")
    if impl:
        os.environ["SHARDSPEC_IMPL"] = impl
    timeout = config.getoption("--pool-timeout")
    if timeout:
        os.environ["SHARDSPEC_POOL_TIMEOUT"] = str(timeout)
    config.addinivalue_line(
        "markers",
        "known_defect(impl, reason, issue=None, raises=None, match=None): a known defect of "
        "that implementation; xfail(strict=True, raises=raises) when it is under test, whose "
        "failure's message must match `match`",
    )
    config.addinivalue_line("markers", "pool: the test dispatches examples to the rank pool")


def pytest_report_header(config: pytest.Config) -> str:
    from conformance.impls import impl_name
    from shardspec.testing.devices import backend, max_world_size

    return (
        f"shardspec conformance: impl={impl_name()} backend={backend()} "
        f"world sizes 1..{max_world_size()}"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from conformance.impls import impl_name
    from shardspec.testing.defects import xfail_raises

    current = impl_name()
    for item in items:
        for mark in item.iter_markers("known_defect"):
            impl = mark.args[0] if mark.args else mark.kwargs["impl"]
            reason = mark.args[1] if len(mark.args) > 1 else mark.kwargs["reason"]
            issue = mark.kwargs.get("issue")
            if impl == current:
                text = f"upstream: {reason}" + (f" (pytorch {issue})" if issue else "")
                # raises/match: the failure the defect shows (CONF-14); the root conftest
                # fails an expected failure whose message does not match
                raises = mark.kwargs.get("raises")
                item.add_marker(
                    pytest.mark.xfail(strict=True, reason=text, raises=xfail_raises(raises))
                )
                if "match" in mark.kwargs:
                    item.add_marker(
                        pytest.mark.failure_matches(mark.kwargs["match"], raises=raises)
                    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    TRACKER.reset()
    result = yield
    if TRACKER.unsupported:
        item.user_properties.append(("unsupported", dict(TRACKER.unsupported)))
        item.user_properties.append(("supported", TRACKER.supported))
        if TRACKER.supported == 0:
            reason, _ = TRACKER.unsupported.most_common(1)[0]
            pytest.skip(reason)
    return result


@pytest.fixture(scope="session")
def impl() -> Impl:
    """The implementation under test."""
    return get_impl()


@pytest.fixture(scope="session")
def pools() -> Iterator[Callable[[int], Any]]:
    """``pools(W)``: the session's rank pool of W ranks (started on first use)."""
    from shardspec.testing import (
        backend,
        get_pool,
        launcher_rank,
        max_world_size,
        shutdown_pools,
        skip_reason,
    )

    if launcher_rank() != 0:
        pytest.skip(
            f"launcher rank {launcher_rank()}: only rank 0 drives the suite, and it starts its "
            "own pool of ranks (one GPU each); launch with `torchrun --nproc-per-node=1` or "
            "plain pytest"
        )
    if backend() == "nccl" and max_world_size() < 1:
        pytest.skip("SHARDSPEC_BACKEND=nccl needs a CUDA GPU; this machine has none")

    from shardspec.testing.devices import simulated_worlds
    from shardspec.testing.simulated import get_simulated_pool, shutdown_simulated

    simulated = simulated_worlds()

    def get(world_size: int) -> Any:
        from conformance import ops_for

        if world_size in simulated:
            return get_simulated_pool(world_size, ops=ops_for())
        reason = skip_reason(world_size)
        if reason is not None:
            pytest.skip(reason)
        return get_pool(world_size, ops=ops_for())

    yield get
    shutdown_pools()
    shutdown_simulated()


@pytest.fixture(scope="session")
def local_pools() -> Callable[[int], Any]:
    """``local_pools(W)``: W ranks run as one program in this thread, on torch's
    ``LocalTensorMode`` (DTensor code only: see ``shardspec.testing.local_tensor``)."""
    from conformance import OPS
    from shardspec.testing.local_tensor import LocalTensorPool

    return lambda world_size: LocalTensorPool(world_size, ops=OPS)
