"""Real FSDP + TP model runs (spec/07-fsdp.md, FSDP-9): 4 gloo ranks on CPU, a 2x2
("dp", "tp") mesh, parallelize_module, and an MLP whose dims do not divide evenly (7 rows over
TP 2 -> [0,4) [4,7), then FSDP 2 -> 2+2 / 2+1; 14 -> 7+7 -> 4+3; 6 -> 3+3 -> 2+1). Every
rank's local parameters and optimizer state must equal the reference slice of the full tensor
per our Layout. The implementation under test decides FSDP1's extension (ours:
``shardspec.fsdp.install``; torch: upstream's default). Each world is a fresh spawned gloo
world with a hard timeout, so an upstream abort fails the test instead of hanging it."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.assertions import GLOO_ABORT
from conformance.cases import case
from conformance.impls import Impl
from conformance.models.fsdp import fsdp1_tp_world, fsdp2_tp_world, run_world
from shardspec.testing import backend, device_type

WORLD = 4
TIMEOUT = 120.0

# The worlds build CPU meshes (init_device_mesh("cpu")) on fresh gloo ranks whatever the
# suite's backend is: under the GPU phases they would repeat the CPU run, not test a device path.
pytestmark = [
    pytest.mark.own_world,
    pytest.mark.skipif(
        device_type() != "cpu",
        reason=f"the FSDP + TP model runs are 4 gloo ranks on CPU; under SHARDSPEC_BACKEND="
        f"{backend()} on {device_type()} they would only repeat nox -s conformance's CPU run",
    ),
]


def _check(results: dict[int, tuple[str, Any]], keys: tuple[str, ...]) -> None:
    bad = [f"rank {r}: {v}" for r, (status, v) in sorted(results.items()) if status != "ok"]
    assert not bad, "ranks failed:\n" + "\n".join(bad)
    problems = [
        f"rank {r} {key}: {msg}"
        for r, (_, rep) in sorted(results.items())
        for key in keys
        for msg in rep[key]
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.rule("FSDP-6", "FSDP-9", "CONF-1")
@pytest.mark.known_defect(
    "torch",
    "FSDP1 SHARDED_STATE_DICT with an uneven TP shard (7 rows over TP 2) aborts gloo in "
    "tensor/parallel/fsdp.py _chunk_dtensor's redistribute ('Received data size doesn't match "
    "expected size'): its DTensor.from_local gets no shape, so each TP rank infers another global "
    "size; not reported upstream (repro fsdp1-tp-uneven-state-dict-aborts); fixed by our "
    "extension",
    raises=AssertionError,
    match=rf"^ranks failed:\n[\s\S]*{GLOO_ABORT}",
)
def test_fsdp1_tp_uneven_mlp_local_state_is_the_reference_slice(impl: Impl) -> None:
    with case():
        if impl.via is None:
            raise impl.unsupported("FSDP1 extension")
        results = run_world(fsdp1_tp_world, WORLD, impl.via, timeout=TIMEOUT)
        _check(results, ("state_dict", "after_step", "optim_state"))


@pytest.mark.rule("FSDP-1", "FSDP-9", "CONF-1")
def test_fsdp2_tp_uneven_mlp_local_params_are_the_reference_slice(impl: Impl) -> None:
    with case():
        if impl.via is None:
            raise impl.unsupported("FSDP2 model runs")
        results = run_world(fsdp2_tp_world, WORLD, timeout=TIMEOUT)
        _check(results, ("params", "after_step", "optim_state"))
