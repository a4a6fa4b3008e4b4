"""pytest wiring for the conformance suite.

- ``--impl`` (or ``SHARDSPEC_IMPL``) picks the implementation under test: a built-in name or
  an adapter ``package.module:Adapter`` (CONF-15), refused at start-up with the reason;
  ``--pool-timeout`` (or ``SHARDSPEC_POOL_TIMEOUT``) the per-example timeout of the rank pool.
- ``@pytest.mark.known_defect(impl, reason, issue=None, raises=None, match=None)`` on a test
  turns into ``xfail(strict=True, raises=raises)`` when the adapter of that name is under test,
  whose failure must match ``match`` (CONF-14); of an exception group (Hypothesis found
  several failures), every member must. An adapter's own ``known_defects`` become the same
  marks on the tests they name.
- Pools import ``conformance.OPS`` and the adapter's ``rank_ops`` on every rank.
- Tests whose every example was unsupported are skipped with "unsupported by <impl>: ...".
- Under ``SHARDSPEC_BACKEND=nccl`` without enough GPUs every pool test skips with the reason.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# The suite is imported as the package `conformance` from the repository root, also when pytest
# is started as `pytest` (whose sys.path[0] is not the working directory).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from conformance.cases import TRACKER  # noqa: E402
from conformance.impls import IMPLS, Adapter, ImplError, get_impl, pool_ops  # noqa: E402

collect_ignore = ["bench/pool.py", "report/__main__.py", "gpu/__main__.py"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardspec conformance")
    group.addoption(
        "--impl",
        default=None,
        help=f"implementation under test: {', '.join(IMPLS)} or an adapter "
        "'package.module:Adapter' (default: $SHARDSPEC_IMPL or shardspec)",
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
    try:
        get_impl()  # a bad name stops the run here, saying what is wrong with it
    except ImplError as e:
        raise pytest.UsageError(str(e)) from None
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

    impl = get_impl()
    spec = "" if impl.name == impl_name() else f" ({impl_name()})"
    return (
        f"shardspec conformance: impl={impl.name}{spec} version {impl.version()} "
        f"backend={backend()} world sizes 1..{max_world_size()}"
    )


def _declared(item: pytest.Item, key: str) -> bool:
    """Whether an adapter's ``known_defects`` key names this test: a node id pattern (with
    "::") or a test function's name, either with fnmatch wildcards."""
    if "::" in key:
        return fnmatch.fnmatchcase(item.nodeid, key)
    names = {item.name, getattr(item, "originalname", item.name)}
    return any(fnmatch.fnmatchcase(n, key) for n in names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from shardspec.testing.defects import xfail_raises

    adapter = get_impl()
    current = adapter.name
    # The adapter's own known defects: the same marks the suite writes, on the tests named.
    unmatched = set(adapter.known_defects)
    for key, d in adapter.known_defects.items():
        declared = pytest.mark.known_defect(
            current, d.reason, issue=d.issue, raises=d.raises, match=d.match
        )
        for item in items:
            if _declared(item, key):
                item.add_marker(declared)
                unmatched.discard(key)
    if unmatched:
        warnings.warn(
            f"known_defects of {current} that name no collected test: {sorted(unmatched)}",
            pytest.PytestWarning,
            stacklevel=1,
        )
    for item in items:
        texts, kinds, patterns = [], [], []
        for mark in item.iter_markers("known_defect"):
            impl = mark.args[0] if mark.args else mark.kwargs["impl"]
            reason = mark.args[1] if len(mark.args) > 1 else mark.kwargs["reason"]
            issue = mark.kwargs.get("issue")
            if impl == current:
                if impl == "torch":
                    texts.append(f"upstream: {reason}" + (f" (pytorch {issue})" if issue else ""))
                else:
                    texts.append(f"{impl}: {reason}" + (f" ({issue})" if issue else ""))
                raises = mark.kwargs.get("raises")
                kinds.append(raises)
                if "match" in mark.kwargs:
                    patterns.append(mark.kwargs["match"])
        if not texts:
            continue
        # raises/match: the failure the defect shows (CONF-14); the root conftest fails an
        # expected failure whose message does not match. Several defects of one
        # implementation on one test: a failure is expected when it is any one of them.
        raises = _either(kinds)
        item.add_marker(
            pytest.mark.xfail(strict=True, reason="; ".join(texts), raises=xfail_raises(raises))
        )
        if patterns:
            item.add_marker(pytest.mark.failure_matches(_any_of(patterns), raises=raises))


def _any_of(patterns: list[str]) -> str:
    """One pattern that finds what any of ``patterns`` finds; their leading global flags
    (``(?s)``), which Python allows only at the start, go to the front."""
    if len(patterns) == 1:
        return patterns[0]
    flags, bodies = "", []
    for p in patterns:
        lead = re.match(r"\(\?([aiLmsux]+)\)", p)
        if lead:
            flags += "".join(f for f in lead.group(1) if f not in flags)
            p = p[lead.end() :]
        bodies.append(f"(?:{p})")
    return (f"(?{flags})" if flags else "") + "|".join(bodies)


def _either(kinds: list[Any]) -> Any:
    """One ``raises`` for several known defects' (None: any exception)."""
    if any(k is None for k in kinds):
        return None
    flat: list[Any] = []
    for k in kinds:
        for t in k if isinstance(k, tuple) else (k,):
            if t not in flat:
                flat.append(t)
    return flat[0] if len(flat) == 1 else tuple(flat)


def _known_signature(item: pytest.Item) -> tuple[str, Any] | None:
    """The pattern and exception type of the known defect this test is a strict expected
    failure of for the adapter under test, where it states one."""
    if item.get_closest_marker("xfail") is None:
        return None
    mark = item.get_closest_marker("failure_matches")
    return None if mark is None else (mark.args[0], mark.kwargs.get("raises"))


# Set to 1: a known defect no longer stops a property at its first example (CONF-14); or to
# test function names (comma-separated, fnmatch patterns): only for those.
DRAW_PAST_KNOWN = "SHARDSPEC_DRAW_PAST_KNOWN"


def _draws_past_known(item: pytest.Item) -> bool:
    value = os.environ.get(DRAW_PAST_KNOWN, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    name = getattr(item, "originalname", item.name)
    return any(fnmatch.fnmatchcase(name, p.strip()) for p in value.split(",") if p.strip())


@contextlib.contextmanager
def _drawn_past_known_defect(item: pytest.Item) -> Iterator[list[BaseException]]:
    """Under a known defect with its signature, every example of a property still runs
    (CONF-14): an example failing with that signature is kept and the property goes on, any
    other failure stops it as usual. Without this, an explicit example that meets the
    defect would stop the property before a single drawn example ran against that
    implementation, and a second defect behind the first would never be seen."""
    seen: list[BaseException] = []
    # Opt-in (SHARDSPEC_DRAW_PAST_KNOWN): every peer session turns it on (noxfile's
    # draw_past_known); a run without it stops at the first known defect, as before.
    signature = _known_signature(item) if _draws_past_known(item) else None
    handle = getattr(getattr(item, "obj", None), "hypothesis", None)
    if signature is None or handle is None:
        yield seen
        return
    from shardspec.testing.defects import mismatch

    pattern, raises = signature
    inner = handle.inner_test

    @functools.wraps(inner)
    def tolerant(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        except Exception as e:
            if mismatch(pattern, e, raises) is not None:
                raise
            seen.append(e)
            return None

    # on the function, which every parametrization of it shares: only for this call
    handle.inner_test = tolerant
    try:
        yield seen
    finally:
        handle.inner_test = inner


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    TRACKER.reset()
    with _drawn_past_known_defect(item) as seen:
        result = yield
    if seen:
        # every other example passed: the property fails with the defect's own failure (the
        # first example that showed it), as the strict expected failure wants
        item.user_properties.append(("known_defect_examples", len(seen)))
        raise seen[0]
    if TRACKER.unsupported:
        item.user_properties.append(("unsupported", dict(TRACKER.unsupported)))
        item.user_properties.append(("supported", TRACKER.supported))
        if TRACKER.supported == 0:
            reason, _ = TRACKER.unsupported.most_common(1)[0]
            pytest.skip(reason)
    return result


@pytest.fixture(scope="session")
def impl() -> Adapter:
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

    ops = pool_ops()  # the suite's operations and the adapter's own (rank_ops)

    def get(world_size: int) -> Any:
        if world_size in simulated:
            return get_simulated_pool(world_size, ops=ops)
        reason = skip_reason(world_size)
        if reason is not None:
            pytest.skip(reason)
        return get_pool(world_size, ops=ops)

    yield get
    shutdown_pools()
    shutdown_simulated()


@pytest.fixture(scope="session")
def local_pools() -> Callable[[int], Any]:
    """``local_pools(W)``: W ranks run as one program in this thread, on torch's
    ``LocalTensorMode`` (DTensor code only: see ``shardspec.testing.local_tensor``)."""
    from shardspec.testing.local_tensor import LocalTensorPool

    ops = pool_ops()
    return lambda world_size: LocalTensorPool(world_size, ops=ops)
