"""The collective checks that run before any data moves.

Every rank sends group rank 0 one fixed-size record: the number of this call on the group, four
short digests (keys and shapes, source layouts, destination layouts, ``max_buffer_bytes`` with
``check_replicas``) and the result of its own input checks. Rank 0 applies the rule to the
records and broadcasts its verdict (:func:`decide_at_root`), so every rank raises the same
:class:`ReshardError`, or all go on. With ``check_replicas`` an all-gather compares a digest of
every replicated source shard (:func:`agree_on_replicas`). A disagreement therefore ends in an
error that names the ranks and what they disagree on, never in a hang or a gloo size-mismatch
abort. The records are bytes, not pickles: nothing another process sends is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from shardspec.metadata import Layout

from .errors import ReshardError, rank_ranges

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = [
    "DIGEST_PARTS",
    "Verdict",
    "agree_on_dtypes",
    "agree_on_inputs",
    "agree_on_replicas",
    "all_gather_bytes",
    "all_gather_sized",
    "decide_at_root",
    "digests",
    "dtype_code",
    "dtype_from_code",
    "dtypes_digest",
    "key_name",
    "next_call",
    "replica_digests",
    "shared_problems",
]

DIGEST_PARTS = (
    "keys and shapes",
    "source layouts",
    "destination layouts",
    "max_buffer_bytes and check_replicas",
)
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
    # Shard order is part of the identity here (each rank's local storage order), as in the
    # layouts' fingerprints, which each layout computes once.
    h = hashlib.blake2b(digest_size=_DIGEST)
    for layout in layouts:
        h.update(layout.fingerprint())
    return h.digest()


def _digest(obj: object) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), sort_keys=False)
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST).digest()


def digests(
    keys: Sequence[str],
    src: Mapping[str, Layout],
    dst: Mapping[str, Layout],
    max_buffer_bytes: int | None,
    check_replicas: bool = False,
) -> bytes:
    """The four digests of what every rank must agree on, concatenated. ``check_replicas``
    must agree too: it adds a collective (:func:`agree_on_replicas`)."""
    return b"".join(
        [
            _digest([[k, list(src[k].shape)] for k in keys]),
            _layout_digest([src[k] for k in keys]),
            _layout_digest([dst[k] for k in keys]),
            _digest([max_buffer_bytes, bool(check_replicas)]),
        ]
    )


def all_gather_bytes(
    payload: bytes, group: dist.ProcessGroup | None, device: torch.device
) -> list[bytes]:
    """Every rank's ``payload`` (all of one length), in group rank order."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    n = len(payload)
    rows = torch.empty((world, n), dtype=torch.uint8, device=device)
    dist.all_gather(list(rows.unbind(0)), mine, group=group)
    raw = rows.cpu().numpy().tobytes()  # one copy, not a tensor and a bytes per rank
    return [raw[i * n : (i + 1) * n] for i in range(world)]


def all_gather_sized(
    payload: bytes, group: dist.ProcessGroup | None, device: torch.device
) -> list[bytes]:
    """Every rank's ``payload`` (of any length), in group rank order: the lengths, then the
    payloads padded to the longest (two :func:`all_gather_bytes`)."""
    sizes = [
        int.from_bytes(b, "little")
        for b in all_gather_bytes(len(payload).to_bytes(8, "little"), group, device)
    ]
    rows = all_gather_bytes(payload.ljust(max(sizes), b"\0"), group, device)
    return [row[:n] for row, n in zip(rows, sizes)]


class Verdict(NamedTuple):
    """What :func:`decide_at_root` hands every rank: the message every rank raises (None: all
    go on) and a number the rule chose (its meaning is the caller's)."""

    error: str | None
    value: int = 0


# The verdict's fixed size on the wire. A message is at most _MAX_MESSAGES distinct messages of
# at most ~480 bytes with their rank lists; a longer one is cut (and says so).
_VERDICT = 8192
_VERDICT_HEAD = 1 + 8 + 4


def decide_at_root(
    record: bytes,
    group: dist.ProcessGroup | None,
    device: torch.device,
    rule: Callable[[list[bytes]], Verdict],
) -> Verdict:
    """Every rank's ``record`` (all of one length) goes to group rank 0, which applies ``rule``
    to them in group rank order; every rank returns rank 0's verdict.

    One gather and one broadcast of a fixed size, where an all-gather would send every record
    to every rank: on gloo, 8 ranks on 2 cores, 3 ms against 15 ms for records of 520 bytes
    (spec/09-checkpoint.md, "Measured"), and W records in all instead of W^2. A rule that
    raises is a bug on rank 0 only: its message becomes the verdict, so no rank waits."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    root = dist.get_global_rank(group, 0) if group is not None else 0
    mine = torch.frombuffer(bytearray(record), dtype=torch.uint8).to(device)
    first = dist.get_rank(group) == 0
    # The records land in the rows of one buffer, read back in one copy: a tensor and a
    # bytes object per rank cost rank 0 about 50 us each, 0.1 s a call at W = 1024.
    n = len(record)
    rows = torch.empty((world, n), dtype=torch.uint8, device=device) if first else None
    dist.gather(mine, list(rows.unbind(0)) if rows is not None else None, dst=root, group=group)
    wire = torch.zeros(_VERDICT, dtype=torch.uint8, device=device)
    if first:
        assert rows is not None
        raw = rows.cpu().numpy().tobytes()
        try:
            verdict = rule([raw[i * n : (i + 1) * n] for i in range(world)])
        except Exception as e:  # a bug in the rule on rank 0 must not leave the others waiting
            verdict = Verdict(f"the agreement's rule failed on rank 0: {type(e).__name__}: {e}")
        wire.copy_(torch.frombuffer(bytearray(_verdict_bytes(verdict)), dtype=torch.uint8))
    dist.broadcast(wire, root, group=group)
    return _verdict_from(bytes(wire.cpu().numpy().tobytes()))


def _verdict_bytes(v: Verdict) -> bytes:
    room = _VERDICT - _VERDICT_HEAD
    msg = (v.error or "").encode("utf-8", "replace")
    if len(msg) > room:
        cut = b" [cut: the message was longer]"
        msg = msg[: room - len(cut)].decode("utf-8", "ignore").encode() + cut
    head = bytes([v.error is not None]) + v.value.to_bytes(8, "little", signed=True)
    return (head + len(msg).to_bytes(4, "little") + msg).ljust(_VERDICT, b"\0")


def _verdict_from(wire: bytes) -> Verdict:
    value = int.from_bytes(wire[1:9], "little", signed=True)
    if not wire[0]:
        return Verdict(None, value)
    n = int.from_bytes(wire[9:13], "little")
    return Verdict(wire[_VERDICT_HEAD : _VERDICT_HEAD + n].decode("utf-8", "replace"), value)


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


def key_name(key: str, names: Mapping[str, str] | None = None) -> str:
    """How messages name tensor ``key``: ``names[key]`` when given (a caller's own words, such
    as "optimizer state 'exp_avg' of parameter '0.bias'" for a key built from them), "the
    tensor" for the one tensor of :func:`shardspec.reshard.reshard` (whose key is empty),
    else ``tensor 'key'``."""
    if names is not None and names.get(key):
        return names[key]
    return f"tensor {key!r}" if key else "the tensor"


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
    separately (every rank takes the same branch: they all get rank 0's verdict).
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
    v = decide_at_root(record.ljust(_RECORD, b"\0"), group, device, _inputs_rule)
    if v.error is None:
        return None if v.value < 0 else v.value
    if v.value:
        # Resynchronise: the next call is one past the furthest any rank got, on every rank,
        # so the group is usable again once each rank has seen this error.
        _CALLS[_world_if_none(group)] = v.value
    raise ReshardError(v.error)


def _inputs_rule(records: list[bytes]) -> Verdict:
    """:func:`agree_on_inputs`' rule. On error the value is the call every rank resumes
    counting from (0: unchanged); else the agreed rounds, -1 when the dtypes are not settled."""
    n = len(DIGEST_PARTS) * _DIGEST
    tail = n + 5 + _MSG
    at = tail + 9 + _DIGEST
    calls = [int.from_bytes(rec[at : at + 8], "little") for rec in records]
    if len(set(calls)) > 1:
        by_call: dict[int, list[int]] = {}
        for rank, c in enumerate(calls):
            by_call.setdefault(c, []).append(rank)
        sides = " vs ".join(f"{rank_ranges(r)} at call {c}" for c, r in sorted(by_call.items()))
        return Verdict(
            f"reshard: the ranks are in different calls on this group ({sides}): a rank left "
            "an earlier call early (its error was caught and the call retried) or called "
            "reshard fewer times. No data was moved; every rank raised this error, and the "
            "group is usable again.",
            max(calls),
        )
    problems: dict[int, str] = {}
    for rank, rec in enumerate(records):
        if rec[n]:
            length = int.from_bytes(rec[n + 1 : n + 5], "little")
            problems[rank] = rec[n + 5 : n + 5 + length].decode("utf-8", "replace")
    if problems:
        return Verdict("reshard: bad input, no data was moved; " + shared_problems(problems))
    for part, name in enumerate(DIGEST_PARTS):
        lo, hi = part * _DIGEST, (part + 1) * _DIGEST
        groups: dict[bytes, list[int]] = {}
        for rank, rec in enumerate(records):
            groups.setdefault(rec[lo:hi], []).append(rank)
        if len(groups) > 1:
            sides = " vs ".join(
                f"{rank_ranges(ranks)} (digest {d.hex()})" for d, ranks in groups.items()
            )
            return Verdict(
                f"reshard: the ranks disagree on the {name}: {sides}; every rank of the group "
                "must pass the same src, dst, shapes and max_buffer_bytes. No data was moved."
            )
    if (
        all(rec[tail] for rec in records)
        and len({rec[tail + 1 : tail + 1 + _DIGEST] for rec in records}) == 1
    ):
        return Verdict(
            None,
            max(
                int.from_bytes(rec[tail + 1 + _DIGEST : tail + 9 + _DIGEST], "little")
                for rec in records
            ),
        )
    return Verdict(None, -1)


# Messages shown in full; the others are counted. Distinct messages from a thousand ranks (each
# names its own shapes) would otherwise make one error a thousand lines long.
_MAX_MESSAGES = 8


def shared_problems(problems: Mapping[int, str]) -> str:
    """Each distinct message of ``{rank: message}`` once, after the ranks that raised it.

    A rank's message that names the rank itself ("local shard #0 on rank 4") names "this
    rank" instead, so that ranks with the same fault share one line:
    ``"ranks 0-1023: max_buffer_bytes must be ..."``, ``"ranks 0, 2, 5-7: ..."``."""
    by_text: dict[str, list[int]] = {}
    for rank in sorted(problems):
        text = re.sub(rf"\brank {rank}(?![0-9])", "this rank", problems[rank])
        by_text.setdefault(text, []).append(rank)
    shown = [f"{rank_ranges(ranks)}: {text}" for text, ranks in by_text.items()]
    if len(shown) > _MAX_MESSAGES:
        hidden = [r for ranks in list(by_text.values())[_MAX_MESSAGES:] for r in ranks]
        shown = shown[:_MAX_MESSAGES] + [
            f"and {len(shown) - _MAX_MESSAGES} other messages from {rank_ranges(hidden)}"
        ]
    return "; ".join(shown)


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
    names: Mapping[str, str] | None = None,
) -> list[int]:
    """The dtype code of every key, learnt from the ranks that know it (those that hold a
    source shard or were told); the same ReshardError on every rank if two ranks differ.
    ``names`` says how the message names a key (:func:`key_name`)."""
    gathered = all_gather_bytes(bytes(codes), group, device) if keys else []
    out = []
    for i, key in enumerate(keys):
        seen: dict[int, list[int]] = {}
        for rank, rec in enumerate(gathered):
            if rec[i]:
                seen.setdefault(rec[i], []).append(rank)
        if len(seen) > 1:
            sides = " vs ".join(
                f"{dtype_from_code(c)} on {rank_ranges(r)}" for c, r in seen.items()
            )
            raise ReshardError(
                f"reshard: the ranks disagree on the dtype of {key_name(key, names)}: {sides}. "
                "No data was moved."
            )
        out.append(next(iter(seen), 0))
    return out


_BoxKey = tuple[tuple[int, ...], tuple[int, ...]]


def _replicated_boxes(layout: Layout) -> set[_BoxKey]:
    """The non-empty boxes of ``layout`` that more than one shard holds."""
    seen: dict[_BoxKey, int] = {}
    for s in layout.shards:
        if s.box.numel:
            k = (s.box.offsets, s.box.sizes)
            seen[k] = seen.get(k, 0) + 1
    return {k for k, n in seen.items() if n > 1}


def _replica_slots(
    keys: Sequence[str], src: Mapping[str, Layout]
) -> dict[int, list[tuple[str, _BoxKey]]]:
    """Every rank's replicated source shards, as (key, box), in key then local order."""
    slots: dict[int, list[tuple[str, _BoxKey]]] = {}
    for key in keys:
        replicated = _replicated_boxes(src[key])
        if not replicated:
            continue
        for s in src[key].shards:  # global order restricted to one rank is its local order
            k = (s.box.offsets, s.box.sizes)
            if k in replicated:
                slots.setdefault(s.rank, []).append((key, k))
    return slots


def replica_digests(
    keys: Sequence[str],
    src: Mapping[str, Layout],
    local: Mapping[str, Sequence[torch.Tensor]],
    rank: int,
) -> bytes:
    """The digest of each of this rank's replicated source shards, in key then local order
    (what :func:`agree_on_replicas` sends): blake2b of its bytes in row-major order. A CUDA
    shard is copied to the CPU to be hashed."""
    import torch

    out = []
    for key in keys:
        replicated = _replicated_boxes(src[key])
        if not replicated:
            continue
        for box, t in zip(src[key].boxes_of(rank), local[key]):
            if (box.offsets, box.sizes) in replicated:
                flat = t.detach().reshape(-1).contiguous().cpu()
                # A one-element view keeps its stride through .contiguous(), which a dtype
                # view refuses: read its one element with stride 1 (as pieces.bytes_of).
                flat = flat.as_strided((flat.numel(),), (1,))
                data = flat.view(torch.uint8).numpy().tobytes()
                out.append(hashlib.blake2b(data, digest_size=_DIGEST).digest())
    return b"".join(out)


def agree_on_replicas(
    keys: Sequence[str],
    src: Mapping[str, Layout],
    mine: bytes,
    group: dist.ProcessGroup | None,
    device: torch.device,
    names: Mapping[str, str] | None = None,
) -> None:
    """Raise the same ReshardError on every rank if two owners of one replicated source box
    hold different bytes, naming the tensor, the box and which ranks hold which copy.

    ``mine`` is this rank's :func:`replica_digests`. Every rank derives every rank's list of
    replicated shards from the (agreed) layouts, so the all-gathered records have one size."""
    from shardspec.metadata import Box

    slots = _replica_slots(keys, src)
    width = max((len(v) for v in slots.values()), default=0) * _DIGEST
    if width == 0:
        return
    records = all_gather_bytes(mine.ljust(width, b"\0"), group, device)
    copies: dict[tuple[str, _BoxKey], dict[bytes, list[int]]] = {}
    for rank, owned in sorted(slots.items()):
        for i, slot in enumerate(owned):
            d = records[rank][i * _DIGEST : (i + 1) * _DIGEST]
            copies.setdefault(slot, {}).setdefault(d, []).append(rank)
    bad = []
    for (key, (offsets, sizes)), by_digest in copies.items():
        if len(by_digest) > 1:
            sides = " vs ".join(
                f"{rank_ranges(r)} (digest {d.hex()})"
                for d, r in sorted(by_digest.items(), key=lambda kv: kv[1][0])
            )
            bad.append(f"{key_name(key, names)}, box {Box(offsets, sizes)}: {sides}")
    if bad:
        shown = bad[:_MAX_MESSAGES] + (
            [f"and {len(bad) - _MAX_MESSAGES} more boxes"] if len(bad) > _MAX_MESSAGES else []
        )
        raise ReshardError(
            "reshard: replicas of a source box differ (check_replicas=True): "
            + "; ".join(shown)
            + ". No data was moved; every rank raised this error."
        )
