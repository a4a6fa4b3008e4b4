"""Registering named operations (spec/05-conformance.md, CONF-8): operations travel by name, so
a name must not look like a rank function's ``"module:function"`` and must name one
operation only."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from shardspec.testing import ops


def _fn(ctx: ops.Context, args: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[Any, list]:
    return None, []


def _other(ctx: ops.Context, args: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[Any, list]:
    return 1, []


@pytest.mark.rule("CONF-8")
@pytest.mark.parametrize("name", ["pkg.mod:fn", ":", "a:b:c"])
def test_an_operation_name_with_a_colon_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must not contain ':'"):
        ops.operation(name, collective=False)
    assert name not in ops.OPERATIONS


@pytest.mark.rule("CONF-8")
def test_an_operation_name_registered_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "OPERATIONS", {})
    register = ops.operation("test.registry.once", collective=True)
    assert register(_fn) is _fn
    assert ops.OPERATIONS["test.registry.once"].fn is _fn
    assert ops.OPERATIONS["test.registry.once"].collective is True
    with pytest.raises(ValueError, match=r"'test\.registry\.once' registered twice"):
        ops.operation("test.registry.once", collective=False)(_other)
    with pytest.raises(ValueError, match="registered twice"):
        register(_other)  # the same decorator used again
    # The first registration stands.
    assert ops.OPERATIONS["test.registry.once"].fn is _fn
    assert ops.OPERATIONS["test.registry.once"].collective is True
    assert list(ops.OPERATIONS) == ["test.registry.once"]
