"""The zero_checkpoint area's checks catch the defects its users report (CONF-5), without a
trainer: a ZeRO trainer made from the reference (every partition FLAT-6's or FLAT-7's buffer of
the saved values, every value read back as saved) passes the property, and each seeded defect
fails it with a message naming the rank, the value and the rule: Adam's moments misaligned by
the padding, two ranks' partitions swapped in a load, the moments swapped, and an offline fp32
state dict of zeros."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from conformance import reference
from conformance.cases import case
from conformance.interface import ZeroCheckpoint
from conformance.tests.test_zero_checkpoint import (
    Case,
    test_a_zero_checkpoint_made_universal_loads_every_value_on_another_world as prop,
)

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
# ZeRO-2 on 3 ranks (63 elements padded to 66) to ZeRO-1 on 2; ZeRO-3 in bf16 on 3 ranks to 2
CASES: list[Case] = [
    (
        {"stage": 2, "dp": 3, "dtype": "float32", "shapes": [[5, 7], [5], [3, 7], [2]]},
        {"stage": 1, "dp": 2},
    ),
    ({"stage": 3, "dp": 3, "dtype": "bfloat16", "shapes": [[3, 5], [7]]}, {"stage": 3, "dp": 2}),
]


def _partitions(shapes: list[list[int]], stage: int, dp: int) -> dict[int, Any]:
    truth = reference.zero_truth(shapes)
    if stage == 3:
        buffers = reference.zero3_buffers(shapes, dp)
    else:
        buffers = reference.zero12_buffers(shapes, dp, 2, False)
    out: dict[int, Any] = {}
    for r, buffer in enumerate(buffers):
        part = {}
        for key in KEYS:
            flat = torch.zeros(len(buffer))
            for at, e in enumerate(buffer):
                if e is not None:
                    flat[at] = truth[key][e[0]][e[1]]
            part[key] = flat
        out[r] = {"partition": part}
    return out


class ReferenceTrainer(ZeroCheckpoint):
    """What a correct ZeRO trainer answers, built from the reference; ``seed`` changes it."""

    name = "reference-zero"

    def __init__(self, seed: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.seed = seed

    def zero_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, Any]:
        shapes = save["shapes"]
        truth = reference.zero_truth(shapes)
        dtype = getattr(torch, save["dtype"])
        read = {
            f"p{k}": {
                **{key: truth[key][k].clone() for key in KEYS},
                "param": truth["fp32"][k].to(dtype),
            }
            for k in range(len(shapes))
        }
        got = {
            "save": _partitions(shapes, save["stage"], save["dp"]),
            "load": _partitions(shapes, load["stage"], load["dp"]),
            "fp32": {f"p{k}": truth["fp32"][k].reshape(s) for k, s in enumerate(shapes)},
        }
        for r in got["load"]:
            got["load"][r]["read"] = {n: dict(v) for n, v in read.items()}
        if self.seed is not None:
            self.seed(got)
        return got


def _misaligned_moments(got: dict[str, Any]) -> None:
    """The last saving rank's exp_avg one element early: the padding counted at the front."""
    last = got["save"][max(got["save"])]["partition"]
    last["exp_avg"] = torch.roll(last["exp_avg"], -1)


def _swapped_ranks(got: dict[str, Any]) -> None:
    """The loading ranks' partitions in the wrong order (shards sorted wrongly)."""
    load = got["load"]
    load[0]["partition"], load[1]["partition"] = load[1]["partition"], load[0]["partition"]


def _swapped_moments(got: dict[str, Any]) -> None:
    """exp_avg and exp_avg_sq swapped in the last parameter read back on rank 1."""
    name = max(got["load"][1]["read"])
    v = got["load"][1]["read"][name]
    v["exp_avg"], v["exp_avg_sq"] = v["exp_avg_sq"], v["exp_avg"]


def _zeros_offline(got: dict[str, Any]) -> None:
    """zero_to_fp32 writing zeros for the last parameter."""
    name = max(got["fp32"])
    got["fp32"][name] = torch.zeros_like(got["fp32"][name])


@pytest.mark.rule("CONF-5", "FLAT-6", "FLAT-7", "FLAT-8")
@pytest.mark.parametrize("c", CASES, ids=["zero2-to-zero1", "zero3-bf16"])
def test_the_reference_trainer_passes(c: Case) -> None:
    with case():
        prop.hypothesis.inner_test(ReferenceTrainer(), c)


@pytest.mark.rule("CONF-5", "FLAT-6", "FLAT-7", "FLAT-8")
@pytest.mark.parametrize("c", CASES, ids=["zero2-to-zero1", "zero3-bf16"])
@pytest.mark.parametrize(
    ("seed", "message"),
    [
        (_misaligned_moments, r"saving rank 2 exp_avg partition \(padding left out\)"),
        (_swapped_ranks, r"loading rank 0 fp32 partition \(padding left out\)"),
        (_swapped_moments, r"loading rank 1 p\d\.exp_avg"),
        (_zeros_offline, r"offline fp32 state dict p\d"),
    ],
    ids=["misaligned-moments", "swapped-ranks", "swapped-moments", "zeros-offline"],
)
def test_each_seeded_defect_is_caught(
    c: Case, seed: Callable[[dict[str, Any]], None], message: str
) -> None:
    with pytest.raises(AssertionError, match=message), case():
        prop.hypothesis.inner_test(ReferenceTrainer(seed), c)
