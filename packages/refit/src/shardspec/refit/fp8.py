"""FP8 e4m3fn block quantization, exactly as spec/10-refit.md writes it (REFIT-7..9), so
that every implementation can be compared bit for bit instead of "close"."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["FP8_MAX", "quantize_blocks", "scale_shape"]

# The largest finite float8_e4m3fn.
FP8_MAX = 448.0


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """``[..., ceil(n / bn), ceil(k / bk)]`` for a tensor of ``shape`` ``[..., n, k]``."""
    *lead, n, k = shape
    return (*lead, math.ceil(n / block[0]), math.ceil(k / block[1]))


def quantize_blocks(
    x: torch.Tensor, block: tuple[int, int] = (128, 128), *, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``x`` (at least 2-D) as float8_e4m3fn and the float32 scale of each
    block of its last two dims, blocks anchored at element 0 (edge blocks partial).

    In float32: ``amax`` = max |x| over the block; ``scale = amax / 448`` (IEEE division), or
    1 where ``amax`` is 0; with ``ue8m0`` the scale is then rounded up to a power of two;
    ``q = clamp(x / scale, -448, 448)`` cast to float8_e4m3fn (round to nearest, ties to
    even). Dequantized, ``x ≈ q * scale``: the scale is vLLM's ``weight_scale_inv``. A block
    with a NaN or an infinity keeps its non-finite scale under ``ue8m0``, and every NaN of
    ``q`` and of the scales is the positive quiet NaN.
    """
    import torch

    if x.dim() < 2:
        raise ValueError(f"FP8 block quantization needs at least 2 dims, got shape {x.shape}")
    bn, bk = block
    *lead, n, k = x.shape
    xf = x.to(torch.float32)
    nb, kb = math.ceil(n / bn), math.ceil(k / bk)
    # Zero padding to whole blocks (only when an edge block is partial) leaves every amax as
    # it is: |0| is never the max of a block that has a nonzero element, and an all-zero
    # block is all-zero either way. Each block is then a view, and its scale broadcasts over
    # it: no full-size tensor of scales, no |x| copy (max |x| is max(max x, -min x)).
    if n % bn or k % bk:
        padded = torch.zeros((*lead, nb * bn, kb * bk), dtype=torch.float32, device=x.device)
        padded[..., :n, :k] = xf
    else:
        padded = xf
    blocks = padded.reshape(*lead, nb, bn, kb, bk)
    amax = torch.maximum(blocks.amax(dim=(-3, -1)), blocks.amin(dim=(-3, -1)).neg())
    scale = amax / FP8_MAX
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    finite = bool(torch.isfinite(amax).all())
    if ue8m0:
        # frexp gives scale = m * 2**e with m in [0.5, 1): a power of two exactly when
        # m == 0.5, else the next power of two up is 2**e. No log2, so no rounding.
        m, e = torch.frexp(scale)
        up = torch.where(m == 0.5, e - 1, e)
        pow2 = torch.ldexp(torch.ones_like(scale), up)
        scale = pow2 if finite else torch.where(torch.isfinite(scale), pow2, scale)
    q = blocks / scale.unsqueeze(-1).unsqueeze(-3)
    q = q.clamp_(-FP8_MAX, FP8_MAX)
    if not finite:
        # Only a block with a NaN or an infinity makes a NaN (x / NaN, inf / inf), and IEEE
        # leaves its sign to the hardware: REFIT-8 fixes it to the positive quiet NaN.
        nan = torch.tensor(math.nan, dtype=torch.float32, device=x.device)
        q = torch.where(q.isnan(), nan, q)
        scale = torch.where(scale.isnan(), nan, scale)
    q = q.to(torch.float8_e4m3fn).reshape(padded.shape)
    if q.shape != x.shape:
        q = q[..., :n, :k].contiguous()
    return q, scale.contiguous()
