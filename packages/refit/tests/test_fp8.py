"""FP8 e4m3fn block quantization against blocks worked by hand (REFIT-7..9): bytes, not
closeness."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

from shardspec.refit import fp8, reference
from shardspec.refit.fp8 import quantize_blocks, scale_shape


def bits(t: torch.Tensor) -> list[list[int]]:
    out: list[list[int]] = t.view(torch.uint8).tolist()
    return out


@pytest.mark.rule("REFIT-7", "REFIT-8")
def test_hand_worked_blocks_with_partial_edges_and_an_all_zero_block() -> None:
    """3x3 in blocks of 2x2: [0,2)x[0,2) has amax 896, scale 2: 1 -> 0.5 (0x30), 896 -> 448
    (0x7E), -896 -> -448 (0xFE); [0,2)x[2,3) has amax 3, scale fp32(3/448): 3 -> 448;
    [2,3)x[0,2) is all zero: scale 1, q 0; [2,3)x[2,3) is 448: scale 1, q 448."""
    x = torch.tensor([[1.0, 896.0, 3.0], [0.0, -896.0, 0.0], [0.0, 0.0, 448.0]])
    q, scale = quantize_blocks(x, (2, 2))
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert bits(q) == [[0x30, 0x7E, 0x7E], [0x00, 0xFE, 0x00], [0x00, 0x00, 0x7E]]
    three = torch.tensor(3.0, dtype=torch.float32) / 448
    assert scale.tolist() == [[2.0, three.item()], [1.0, 1.0]]


@pytest.mark.rule("REFIT-8")
def test_rounding_is_to_nearest_even_and_the_largest_value_saturates() -> None:
    """Scale 1 (amax 448): 248 lies halfway between 240 (0x77) and 256 (0x78) and goes to
    the even mantissa, 256; 250 goes to 256; 17.81 has a scale whose quotient is 448.00003,
    which lands on 448 (0x7E), never NaN (0x7F)."""
    q, _ = quantize_blocks(torch.tensor([[448.0, 248.0, 250.0, 240.0]]), (1, 4))
    assert bits(q) == [[0x7E, 0x78, 0x78, 0x77]]
    q, scale = quantize_blocks(torch.tensor([[17.81, 0.0]]), (1, 2))
    assert (torch.tensor(17.81) / scale[0, 0]).item() > 448
    assert bits(q) == [[0x7E, 0x00]]


@pytest.mark.rule("REFIT-9")
def test_ue8m0_scales_are_rounded_up_to_a_power_of_two() -> None:
    """amax 1000: 1000/448 = 2.23 -> 4; 1000/4 = 250 -> 256 (0x78), 960/4 = 240 (0x77).
    amax 896: 896/448 = 2 is a power of two already and stays. An all-zero block: 1."""
    x = torch.tensor([[1000.0, 960.0, 896.0, 1.0, 0.0, 0.0]])
    q, scale = quantize_blocks(x, (1, 2), ue8m0=True)
    assert scale.tolist() == [[4.0, 2.0, 1.0]]
    assert bits(q) == [[0x78, 0x77, 0x7E, 0x30, 0x00, 0x00]]


@pytest.mark.rule("REFIT-8", "REFIT-9")
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("quantize", [quantize_blocks, reference.quantize], ids=["fast", "ref"])
def test_a_nan_or_an_infinity_gives_positive_quiet_nans(quantize: object, ue8m0: bool) -> None:
    """Blocks of 1x2. [1, -NaN]: amax NaN, scale NaN, both values NaN. [inf, 2]: scale inf
    (kept under ue8m0), inf/inf NaN, 2/inf 0. [-inf, -3]: -inf/inf NaN, -3/inf -0. Every NaN
    the positive quiet one: e4m3fn 0x7F, float32 0x7FC00000; x86 would make some negative."""
    x = torch.tensor([[1.0, -float("nan")], [float("inf"), 2.0], [-float("inf"), -3.0]])
    q, scale = quantize(x, (1, 2), ue8m0=ue8m0)  # type: ignore[operator]
    assert bits(q) == [[0x7F, 0x7F], [0x7F, 0x00], [0x7F, 0x80]]
    assert scale.view(torch.int32).view(-1).tolist() == [0x7FC00000, 0x7F800000, 0x7F800000]


@pytest.mark.rule("REFIT-7", "REFIT-8", "REFIT-9")
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 7), min_size=2, max_size=3).map(tuple),
    st.sampled_from([(1, 1), (2, 3), (4, 4), (3, 2)]),
    st.integers(0, 2**31),
    st.booleans(),
    st.sampled_from(["float32", "bfloat16"]),
    st.booleans(),
)
def test_the_fast_quantizer_equals_the_references_loop(
    shape: tuple[int, ...],
    block: tuple[int, int],
    seed: int,
    ue8m0: bool,
    dtype: str,
    one_pass: bool,
) -> None:
    """The vectorised quantizer (the executor's) against the reference's loop over blocks,
    byte for byte: partial edge blocks, leading (expert) dims, all-zero blocks, a NaN or an
    infinity in some examples; in chunks checked for the fix-up (the CPU's way) and in one
    pass fixed up unasked (an accelerator's, here on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 100
    x[x.abs() < 30] = 0
    if seed % 3 == 0:
        x.view(-1)[seed % x.numel()] = [math.nan, math.inf, -math.inf][seed % 9 // 3]
    x = x.to(getattr(torch, dtype))
    with mock.patch.object(fp8, "_one_pass", return_value=one_pass):
        q, scale = quantize_blocks(x, block, ue8m0=ue8m0)
    want_q, want_scale = reference.quantize(x, block, ue8m0=ue8m0)
    assert bits(q.reshape(-1, q.shape[-1])) == bits(want_q.reshape(-1, q.shape[-1]))
    assert torch.equal(scale.view(torch.int32), want_scale.view(torch.int32))


@pytest.mark.rule("REFIT-7")
def test_scales_have_one_entry_per_block_of_the_last_two_dims() -> None:
    assert scale_shape((300, 129), (128, 128)) == (3, 2)
    assert scale_shape((4, 256, 128), (128, 128)) == (4, 2, 1)
    q, scale = quantize_blocks(torch.ones(2, 5, 3), (2, 2))
    assert scale.shape == (2, 3, 2) and q.shape == (2, 5, 3)


@pytest.mark.rule("REFIT-7", "REFIT-8")
@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.sampled_from([(1, 1), (2, 3), (4, 4)]),
    st.integers(0, 2**31),
    st.booleans(),
)
def test_each_block_is_quantized_as_a_tensor_of_its_own(
    n: int, k: int, block: tuple[int, int], seed: int, ue8m0: bool
) -> None:
    """The vectorised quantizer equals a loop over blocks, each quantized alone as one
    block: the spec's formula applied block by block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * 100
    x[x.abs() < 20] = 0  # some all-zero blocks
    q, scale = quantize_blocks(x, block, ue8m0=ue8m0)
    bn, bk = block
    for i in range(0, n, bn):
        for j in range(0, k, bk):
            part = x[i : i + bn, j : j + bk]
            amax = part.abs().max()
            s = torch.tensor(1.0) if amax == 0 else amax / 448
            if ue8m0:
                s = torch.tensor(2.0) ** torch.ceil(torch.log2(s))
            assert scale[i // bn, j // bk].item() == s.item()
            want = (part / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            assert bits(q[i : i + bn, j : j + bk]) == bits(want)
