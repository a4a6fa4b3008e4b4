"""The collective load's flattening of a state dict (``collective_load.flatten``) against
DCP's ``flatten_state_dict``, which it stands in for (CKPT-23: keys as ``dcp.load`` reads
them)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shardspec.checkpoint.collective_load import flatten

torch = pytest.importorskip("torch")
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # noqa: E402

_KEYS = st.text(alphabet="ab.c_0", min_size=1, max_size=6)


@st.composite
def _state_dicts(draw: st.DrawFn) -> dict[str, Any]:
    leaves = st.one_of(
        st.builds(lambda n: torch.arange(n, dtype=torch.float32), st.integers(0, 4)),
        st.builds(lambda n: torch.nn.Parameter(torch.ones(n)), st.integers(0, 4)),
        st.integers(),
        st.just("text"),
    )
    values = st.recursive(leaves, lambda inner: st.dictionaries(_KEYS, inner, max_size=3),
                          max_leaves=6)  # fmt: skip
    return draw(st.dictionaries(_KEYS, values, max_size=5))


@pytest.mark.rule("CKPT-23")
@settings(max_examples=100, deadline=None)
@given(sd=_state_dicts())
def test_flatten_is_dcps_flattening(sd: dict[str, Any]) -> None:
    try:
        want = flatten_state_dict(sd)
    except ValueError as e:  # two paths flatten to one key: refused alike
        with pytest.raises(ValueError, match=str(e)):
            flatten(sd)
        return
    flat, mappings = flatten(sd)
    assert list(flat) == list(want[0]) and mappings == want[1]
    assert all(flat[k] is want[0][k] for k in flat)


@pytest.mark.rule("CKPT-23")
def test_a_flat_dict_of_tensors_is_its_own_flattening() -> None:
    sd = {"b.w": torch.ones(2), "a": torch.nn.Parameter(torch.zeros(1))}
    flat, mappings = flatten(sd)
    assert flat == sd and flat is not sd and mappings == {"b.w": ("b.w",), "a": ("a",)}
