"""One assertion helper per kind of fact, each failing with the same message shape:

    out.shape=(3,), but should be (4,) [chunk(shape=(7,), k=2)]

``<what>=<actual>, but should be <expected> [<example>]``, so that a failure reads the same in
every area and the report can quote it. ``example`` is a short description of the case. A
test that cites several rules passes ``rule=`` to say which one this fact checks; the message
then ends ``(breaks RULE-N)`` and the report names that rule (CONF-7).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from shardspec.metadata import Box, Layout
from shardspec.testing.protocol import tensor_bytes

__all__ = [
    "GLOO_ABORT",
    "GLOO_SIZE_MISMATCH",
    "assert_boxes_equal",
    "assert_equal",
    "assert_layouts_equal",
    "assert_tensor_bitwise",
    "assert_verdict",
    "describe_layout",
    "fail",
]


# A known defect's failure (CONF-14) when torch sends gloo a collective whose sizes differ
# across ranks: gloo's enforce aborts the rank process (SIGABRT), and the pool reports the
# death with the rank's output. A rank that hangs or dies of something else does not match.
GLOO_SIZE_MISMATCH = "Received data size doesn't match expected size"
GLOO_ABORT = rf"died \(exit code -6\)[\s\S]*{GLOO_SIZE_MISMATCH}"


def fail(what: str, actual: Any, expected: Any, example: str, rule: str | None = None) -> None:
    tag = f" (breaks {rule})" if rule else ""
    raise AssertionError(f"{what}={actual!r}, but should be {expected!r} [{example}]{tag}")


def assert_equal(
    what: str, actual: Any, expected: Any, example: str, rule: str | None = None
) -> None:
    """A plain fact (a shape, an offset, an inferred dim)."""
    if actual != expected:
        fail(what, actual, expected, example, rule)


def assert_verdict(
    what: str, accepted: bool, valid: bool, example: str, rule: str | None = None
) -> None:
    """A validator's verdict against the oracle's: accept exactly the valid layouts."""
    if accepted != valid:
        fail(
            what,
            "accepted" if accepted else "rejected",
            "accepted" if valid else "rejected",
            example,
            rule=rule,
        )


def _pairs(layout: Layout) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    return sorted((s.rank, s.box.offsets, s.box.sizes) for s in layout.shards)


def assert_layouts_equal(
    what: str, actual: Layout, expected: Layout, example: str, rule: str | None = None
) -> None:
    """Layout equality (LAYOUT-5): same shape, same multiset of (box, rank). Names the first
    rank whose boxes differ."""
    if actual.shape != expected.shape:
        fail(f"{what}.shape", actual.shape, expected.shape, example, rule=rule)
    if actual == expected:
        return
    for rank in sorted(set(actual.ranks) | set(expected.ranks)):
        a = sorted(actual.boxes_of(rank))
        e = sorted(expected.boxes_of(rank))
        if a != e:
            fail(f"{what}.boxes_of({rank})", _short(a), _short(e), example, rule=rule)
    fail(what, _pairs(actual), _pairs(expected), example, rule=rule)  # pragma: no cover


def _short(boxes: Sequence[Box]) -> list[str]:
    return [f"{list(b.offsets)}+{list(b.sizes)}" for b in boxes]


def assert_boxes_equal(
    what: str, actual: Sequence[Box], expected: Sequence[Box], example: str, rule: str | None = None
) -> None:
    """The same boxes in the same (local storage) order."""
    if list(actual) != list(expected):
        fail(what, _short(actual), _short(expected), example, rule=rule)


def assert_tensor_bitwise(
    what: str, actual: torch.Tensor, expected: torch.Tensor, example: str, rule: str | None = None
) -> None:
    """Same dtype, same shape, same bytes: NaN payloads and -0.0 count."""
    if actual.dtype != expected.dtype:
        fail(f"{what}.dtype", actual.dtype, expected.dtype, example, rule=rule)
    if tuple(actual.shape) != tuple(expected.shape):
        fail(f"{what}.shape", tuple(actual.shape), tuple(expected.shape), example, rule=rule)
    a, e = tensor_bytes(actual), tensor_bytes(expected)
    if a != e:
        item = max(actual.element_size(), 1)
        first = next(i for i in range(len(a)) if a[i] != e[i]) // item
        flat_a = actual.detach().cpu().contiguous().reshape(-1)
        flat_e = expected.detach().cpu().contiguous().reshape(-1)
        fail(
            f"{what}.flat[{first}]",
            flat_a[first].item(),
            flat_e[first].item(),
            f"{example}; bytes differ",
            rule=rule,
        )


def describe_layout(layout: Layout) -> str:
    """A short, readable form for failure messages: ``layout((5,), r0:[0]+[3] r1:[3]+[2])``."""
    body = " ".join(f"r{s.rank}:{list(s.box.offsets)}+{list(s.box.sizes)}" for s in layout.shards)
    return f"layout({layout.shape}, {body})"
