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
    nb, kb = math.ceil(n / bn), math.ceil(k / bk)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((*lead, nb, kb), dtype=torch.float32, device=x.device)
    if q.numel() == 0:
        return q, scale.fill_(1.0)  # no element: every block (if any) is all-zero
    xs, qs, ss = x.reshape(-1, n, k), q.view(-1, n, k), scale.view(-1, nb, kb)
    # A few block rows at a time through one float32 buffer that stays in cache: a whole
    # tensor's float32 copy and quotient would cost more than the quantization (page faults
    # of fresh memory). Zero padding to whole blocks (only when an edge block is partial)
    # leaves every amax as it is: |0| is never the max of a block that has a nonzero
    # element, and an all-zero block is all-zero either way.
    one_pass = _one_pass(x.device)
    rows = -(-n // bn) * bn if one_pass else bn * max(1, _CHUNK // (bn * kb * bk))
    buf = torch.empty((rows, kb * bk), dtype=torch.float32, device=x.device)
    partial_k = k % bk != 0
    for lead_i in range(xs.shape[0]):
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            nr = -(-(r1 - r0) // bn) * bn
            b = buf[:nr]
            if partial_k or nr != r1 - r0:
                b.zero_()
            b[: r1 - r0, :k].copy_(xs[lead_i, r0:r1])
            blocks = b.view(nr // bn, bn, kb, bk)
            # max |x| is max(max x, -min x): no |x| copy
            amax = torch.maximum(blocks.amax(dim=(1, 3)), blocks.amin(dim=(1, 3)).neg())
            sc = _scale(amax, ue8m0)
            blocks.div_(sc[:, None, :, None])
            if one_pass or not bool(((sc >= _TINY) & (sc <= _BIG)).all()):
                # A normal finite scale keeps |x / scale| under 448 * (1 + 2**-22), which
                # rounds to 448 anyway, so only other scales need the clamp: a subnormal one
                # (rounded by up to half its value), one that underflowed to 0 or one that is
                # not finite. Those also make NaNs (0 / 0, x / NaN, inf / inf), whose sign
                # IEEE leaves to the hardware: REFIT-8 fixes it to the positive quiet NaN.
                blocks.clamp_(-FP8_MAX, FP8_MAX)
                b.masked_fill_(b.isnan(), math.nan)
                sc.masked_fill_(sc.isnan(), math.nan)
            qs[lead_i, r0:r1].copy_(b[: r1 - r0, :k])
            ss[lead_i, r0 // bn : r0 // bn + nr // bn].copy_(sc)
    return q, scale


def _one_pass(device: torch.device) -> bool:
    """Whether to quantize each tensor in one pass, fixed up without looking: on an
    accelerator, where asking whether a chunk needs the fix-up would wait for the device on
    every chunk, and a pass over the whole tensor is what it is fast at."""
    return device.type != "cpu"


# Elements of float32 a chunk of block rows holds (1 MiB).
_CHUNK = 1 << 18
# The least normal and the largest finite float32.
_TINY, _BIG = 2.0**-126, 3.4028234663852886e38


def _scale(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """REFIT-8's scale of each block from its amax, REFIT-9's power of two with ``ue8m0``."""
    import torch

    scale = amax / FP8_MAX
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    if ue8m0:
        # frexp gives scale = m * 2**e with m in [0.5, 1): a power of two exactly when
        # m == 0.5, else the next power of two up is 2**e. No log2, so no rounding. A NaN or
        # infinite scale stays as it is.
        m, e = torch.frexp(scale)
        up = torch.where(m == 0.5, e - 1, e)
        pow2 = torch.ldexp(torch.ones_like(scale), up)
        scale = torch.where(torch.isfinite(scale), pow2, scale)
    return scale
