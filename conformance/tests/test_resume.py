"""Resume on another mesh (spec/07-fsdp.md FSDP-12): ``reshard_for`` between drawn meshes of
4 gloo ranks (FSDP, FSDP x TP, TP alone, HSDP), from sharded, full and unsharded-run state
dicts with their Adam state, loaded into an FSDP2 model; every parameter and optimizer state
equals the plain model's after the same step. Each example is a fresh spawned world running a
few resumes; torch has no resume of its own, so the area is unsupported there."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings, strategies as st

from conformance.cases import case
from conformance.impls import Impl
from conformance.models.fsdp import RESUME_MESHES, RESUME_SOURCES, resume_world, run_world
from shardspec.testing import backend, device_type

WORLD = 4
TIMEOUT = 300.0

pytestmark = [
    pytest.mark.own_world,
    pytest.mark.skipif(
        device_type() != "cpu",
        reason=f"the resume worlds are 4 gloo ranks on CPU; under SHARDSPEC_BACKEND={backend()} "
        f"on {device_type()} they would only repeat nox -s conformance's CPU run",
    ),
]

resumes = st.lists(
    st.tuples(
        st.sampled_from(RESUME_MESHES),
        st.sampled_from(RESUME_MESHES),
        st.sampled_from(RESUME_SOURCES),
    ).map(list),
    min_size=1,
    max_size=4,
)


@pytest.mark.rule("FSDP-12", "CONF-1")
# A world launch costs seconds: a few examples of up to 4 resumes each, and every source kind
# with a TP and an HSDP side explicitly.
@settings(max_examples=2, deadline=None)
@given(resumes)
@example(
    [
        [(2, 2), (4, 1), "sharded"],
        [(4, 1), (2, 2), "full"],
        [(2, 2, 1), (1, 4), "unsharded"],
        [(1, 4), (2, 2, 1), "sharded"],
    ]
)
def test_reshard_for_resumes_every_source_on_every_mesh(impl: Impl, cases: list[Any]) -> None:
    with case():
        if impl.via != "shardspec":
            raise impl.unsupported("resuming on another mesh (reshard_for)")
        results = run_world(resume_world, WORLD, cases, timeout=TIMEOUT)
        failed = [f"rank {r}: {v}" for r, (status, v) in sorted(results.items()) if status != "ok"]
        assert not failed, "ranks failed:\n" + "\n".join(failed)
        bad = [f"rank {r}: {m}" for r, (_, rep) in sorted(results.items()) for m in rep["resume"]]
        assert not bad, "\n".join(bad)
