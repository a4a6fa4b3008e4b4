"""The collective checks that run before any data moves.

Every rank all-gathers one fixed-size record: the number of this call on the group, four short
digests (keys and shapes, source layouts, destination layouts, ``max_buffer_bytes``) and the
result of its own input checks.
Every rank then applies the same rule to the same gathered bytes, so they all raise the same
:class:`ReshardError`, or all go on. A disagreement therefore ends in an error that names the
ranks and what they disagree on, never in a hang or a gloo size-mismatch abort. The records
are bytes, not pickles: nothing another process sends is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from shardspec.metadata import Layout

from .errors import ReshardError

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = [
    "DIGEST_PARTS",
    "agree_on_dtypes",
    "agree_on_inputs",
    "digests",
    "dtype_code",
    "dtype_from_code",
    "dtypes_digest",
    "next_call",
]

DIGEST_PARTS = ("keys and shapes", "source layouts", "destination layouts", "max_buffer_bytes")
_DIGEST = 8
# knows every dtype, digest of the dtypes, rounds this rank needs, number of the call
_TAIL = 1 + _DIGEST + 8 + 8
_MSG = 512 - len(DIGEST_PARTS) * _DIGEST - 5 - _TAIL
_RECORD = 512

_DTYPE_NAMES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
)


def _layout_digest(layouts: Sequence[Layout]) -> bytes:
    # Shard order is part of the identity here: it is each rank's local storage order. The
    # repr of nested int tuples is canonical, and much cheaper than JSON for 10^3 tensors.
    h = hashlib.blake2b(digest_size=_DIGEST)
    for layout in layouts:
        h.update(repr(layout.shape).encode())
        h.update(repr([(s.box.offsets, s.box.sizes, s.rank) for s in layout.shards]).encode())
        h.update(b";")
    return h.digest()


def _digest(obj: object) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), sort_keys=False)
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST).digest()


def digests(
    keys: Sequence[str],
    src: Mapping[str, Layout],
    dst: Mapping[str, Layout],
    max_buffer_bytes: int | None,
) -> bytes:
    """The four digests of what every rank must agree on, concatenated."""
    return b"".join(
        [
            _digest([[k, list(src[k].shape)] for k in keys]),
            _layout_digest([src[k] for k in keys]),
            _layout_digest([dst[k] for k in keys]),
            _digest(max_buffer_bytes),
        ]
    )


def _all_gather_bytes(
    payload: bytes, group: dist.ProcessGroup | None, device: torch.device
) -> list[bytes]:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [bytes(p.cpu().numpy().tobytes()) for p in parts]


# Calls of reshard per process group, counted on every rank. A group object dies with its
# destruction, and a new one starts again at 0 on every rank alike.
_CALLS: weakref.WeakKeyDictionary[dist.ProcessGroup, int] = weakref.WeakKeyDictionary()


def _world_if_none(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    import torch.distributed as dist

    pg = dist.group.WORLD if group is None else group
    assert pg is not None, "no default process group"
    return pg


def next_call(group: dist.ProcessGroup | None) -> int:
    """The number of this reshard call on ``group`` (1, 2, ...), counted on this rank.

    It travels in the agreement record: ranks whose counts differ are not in the same call
    (one left an earlier call early, or started a retry while the others still wait), and
    they all raise instead of completing each other's collectives with the wrong data."""
    pg = _world_if_none(group)
    n = _CALLS.get(pg, 0) + 1
    _CALLS[pg] = n
    return n


def dtypes_digest(codes: Sequence[int]) -> bytes:
    return hashlib.blake2b(bytes(codes), digest_size=_DIGEST).digest()


def agree_on_inputs(
    digest: bytes,
    error: str | None,
    group: dist.ProcessGroup | None,
    device: torch.device,
    *,
    codes: Sequence[int] | None = None,
    rounds: int = 0,
    call: int | None = None,
) -> int | None:
    """Raise the same ReshardError on every rank unless all ranks are fine and agree.

    ``call`` is this call's number on the group (:func:`next_call`); ranks at different
    calls raise first, whatever else their records say. A rank that knows the dtype of
    every tensor passes their ``codes`` and the ``rounds`` it needs. When every rank did and
    their dtypes agree, the agreed number of rounds (the maximum) is returned and no further
    collective is needed; otherwise None, and the caller agrees on the dtypes and the rounds
    separately (every rank takes the same branch, as they decide on the same gathered bytes).
    """
    msg = (error or "").encode("utf-8", "replace")[:_MSG]
    call = 0 if call is None else call
    record = digest.ljust(len(DIGEST_PARTS) * _DIGEST, b"\0")
    record += bytes([1 if error is not None else 0]) + len(msg).to_bytes(4, "little")
    record += msg.ljust(_MSG, b"\0")
    known = codes is not None and all(codes)
    record += bytes([1 if known else 0])
    record += dtypes_digest(codes) if known and codes is not None else bytes(_DIGEST)
    record += max(rounds, 0).to_bytes(8, "little")
    record += call.to_bytes(8, "little")
    records = _all_gather_bytes(record.ljust(_RECORD, b"\0"), group, device)
    n = len(DIGEST_PARTS) * _DIGEST
    tail = n + 5 + _MSG
    at = tail + 9 + _DIGEST
    calls = [int.from_bytes(rec[at : at + 8], "little") for rec in records]
    if len(set(calls)) > 1:
        # Resynchronise: the next call is one past the furthest any rank got, on every rank,
        # so the group is usable again once each rank has seen this error.
        _CALLS[_world_if_none(group)] = max(calls)
        by_call: dict[int, list[int]] = {}
        for rank, c in enumerate(calls):
            by_call.setdefault(c, []).append(rank)
        sides = " vs ".join(f"ranks {r} at call {c}" for c, r in sorted(by_call.items()))
        raise ReshardError(
            f"reshard: the ranks are in different calls on this group ({sides}): a rank left "
            "an earlier call early (its error was caught and the call retried) or called "
            "reshard fewer times. No data was moved; every rank raised this error, and the "
            "group is usable again."
        )
    problems = []
    for rank, rec in enumerate(records):
        if rec[n]:
            length = int.from_bytes(rec[n + 1 : n + 5], "little")
            problems.append(
                f"rank {rank}: {rec[n + 5 : n + 5 + length].decode('utf-8', 'replace')}"
            )
    if problems:
        raise ReshardError("reshard: bad input, no data was moved; " + "; ".join(problems))
    for part, name in enumerate(DIGEST_PARTS):
        lo, hi = part * _DIGEST, (part + 1) * _DIGEST
        groups: dict[bytes, list[int]] = {}
        for rank, rec in enumerate(records):
            groups.setdefault(rec[lo:hi], []).append(rank)
        if len(groups) > 1:
            sides = " vs ".join(f"ranks {ranks} (digest {d.hex()})" for d, ranks in groups.items())
            raise ReshardError(
                f"reshard: the ranks disagree on the {name}: {sides}; every rank of the group "
                "must pass the same src, dst, shapes and max_buffer_bytes. No data was moved."
            )
    if (
        all(rec[tail] for rec in records)
        and len({rec[tail + 1 : tail + 1 + _DIGEST] for rec in records}) == 1
    ):
        return max(
            int.from_bytes(rec[tail + 1 + _DIGEST : tail + 9 + _DIGEST], "little")
            for rec in records
        )
    return None


def dtype_code(dtype: torch.dtype) -> int:
    """1-based code of a dtype for the wire (0 means unknown); raises for unsupported ones."""
    import torch

    for i, name in enumerate(_DTYPE_NAMES):
        if getattr(torch, name, None) == dtype:
            return i + 1
    raise ReshardError(f"reshard does not support dtype {dtype}")


def dtype_from_code(code: int) -> torch.dtype:
    import torch

    dt = getattr(torch, _DTYPE_NAMES[code - 1])
    assert isinstance(dt, torch.dtype)
    return dt


def agree_on_dtypes(
    keys: Sequence[str],
    codes: Sequence[int],
    group: dist.ProcessGroup | None,
    device: torch.device,
) -> list[int]:
    """The dtype code of every key, learnt from the ranks that know it (those that hold a
    source shard or were told); the same ReshardError on every rank if two ranks differ."""
    gathered = _all_gather_bytes(bytes(codes), group, device) if keys else []
    out = []
    for i, key in enumerate(keys):
        seen: dict[int, list[int]] = {}
        for rank, rec in enumerate(gathered):
            if rec[i]:
                seen.setdefault(rec[i], []).append(rank)
        if len(seen) > 1:
            sides = " vs ".join(f"{dtype_from_code(c)} on ranks {r}" for c, r in seen.items())
            raise ReshardError(
                f"reshard: the ranks disagree on the dtype of {key!r}: {sides}. No data was moved."
            )
        out.append(next(iter(seen), 0))
    return out
