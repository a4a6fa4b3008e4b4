"""The executor's schedule: which bytes of which piece travel in which round, as integers.

Everything here is computed from a rank's plan and the agreed element sizes alone, with no
tensor and no process group, so the two ends of every pair derive the same schedule without
exchanging sizes (:mod:`shardspec.reshard.executor` moves the bytes it names):

* a *stream* (:func:`pair_streams`, :func:`local_stream`) is everything one rank sends to one
  peer: the pieces of every tensor in key order, then wire order, each an :class:`Entry` at a
  byte offset that is a multiple of its own element size (a piece of no bytes adds no padding);
* :func:`rounds_needed` is how many rounds keep a rank's send or receive buffer within a
  budget; round ``t`` moves the ``t``-th window of every stream (:func:`quotas`,
  :func:`windows`), and windows start at multiples of :data:`WINDOW` bytes of the stream,
  which every element size divides, so no element is cut;
* :func:`round_cuts` says which elements of which entry each window holds and where they sit
  in the round's flat buffer;
* :func:`round_messages` groups one round's cuts into the point-to-point messages both ends
  of a pair derive alike (a large cut alone, runs of small cuts together);
* :func:`contiguous_span` finds the case where the streams already lie, back to back and in
  order, in one contiguous tensor (so that tensor can be the buffer itself).

A *job* is whatever the caller schedules one tensor with: anything with a ``plan``
(:class:`shardspec.reshard.planner.Plan`) and an ``itemsize`` (bytes per element). Entries
hold the caller's job as it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .planner import Piece, Plan

__all__ = [
    "DIRECT_BYTES",
    "WINDOW",
    "Cut",
    "Entry",
    "Message",
    "Scheduled",
    "Streams",
    "align",
    "buffer_bytes",
    "contiguous_span",
    "local_stream",
    "pair_streams",
    "peers_of",
    "piece_bytes",
    "quotas",
    "round_cuts",
    "round_messages",
    "rounds_needed",
    "stream_len",
    "windows",
    "with_self",
]

# The largest element size (complex128): windows on this grid of a stream never cut an element,
# since every piece starts at a multiple of its own element size, which divides it.
WINDOW = 16


class Scheduled(Protocol):
    """What the schedule reads of a job: the tensor's plan for this rank and its element size."""

    @property
    def plan(self) -> Plan: ...

    @property
    def itemsize(self) -> int: ...


J = TypeVar("J", bound=Scheduled)
T = TypeVar("T")


@dataclass
class Entry(Generic[J]):
    """One piece in a stream."""

    job: J
    piece: Piece
    offset: int  # byte offset in the pair's stream (a multiple of the element size)
    nbytes: int


# Elements [first, stop) of an entry's piece, in row-major order, lie at this byte of the
# round's buffer: (entry, first, stop, position).
Cut = tuple[Entry[J], int, int, int]


def align(n: int, to: int = WINDOW) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return -(-n // to) * to


def _place(entries: list[Entry[J]], job: J, p: Piece, end: int) -> int:
    """Append piece ``p`` to a stream that ends at byte ``end``; return the new end. Both
    sides of a pair derive the same offsets from the shared plan and the agreed dtypes."""
    nbytes = p.numel * job.itemsize
    if nbytes == 0:  # takes no room, so it must not add padding either
        entries.append(Entry(job, p, end, 0))
        return end
    offset = align(end, job.itemsize)
    entries.append(Entry(job, p, offset, nbytes))
    return offset + nbytes


def pair_streams(
    jobs: Sequence[J], rank: int, world: int, *, sending: bool
) -> list[list[Entry[J]]]:
    """The streams ``rank`` sends to (``sending``) or receives from every rank of ``world``
    (its own is empty: local pieces are not part of a pair's stream)."""
    streams: list[list[Entry[J]]] = [[] for _ in range(world)]
    ends = [0] * world
    for job in jobs:
        pieces = job.plan.sends(rank) if sending else job.plan.receives(rank)
        for p in pieces:
            peer = p.dst_rank if sending else p.src_rank
            ends[peer] = _place(streams[peer], job, p, ends[peer])
    return streams


def local_stream(jobs: Sequence[J], rank: int) -> list[Entry[J]]:
    """This rank's local pieces laid out as a stream to itself (same format as a pair's)."""
    entries: list[Entry[J]] = []
    end = 0
    for job in jobs:
        for p in job.plan.local(rank):
            end = _place(entries, job, p, end)
    return entries


def stream_len(entries: Sequence[Entry[J]]) -> int:
    """The bytes of a stream: where its last entry ends."""
    return entries[-1].offset + entries[-1].nbytes if entries else 0


def rounds_needed(lengths: Sequence[int], budget: int | None) -> int:
    """Rounds that keep one rank's buffer for streams of ``lengths`` within ``budget`` bytes
    (within ``WINDOW * (peers + 1)`` where the budget is smaller): none if nothing moves, one
    without a budget."""
    total = sum(lengths)
    if total == 0:
        return 0
    if budget is None:
        return 1
    peers = sum(1 for n in lengths if n)
    # Each pair's window is rounded up to WINDOW, costing at most WINDOW per peer per round;
    # below that the bound cannot hold and windows shrink to WINDOW bytes.
    usable = max(budget - WINDOW * peers, WINDOW)
    return -(-total // usable)


class Streams(Generic[J]):
    """This rank's byte streams: one to and one from every peer, and their lengths."""

    def __init__(self, jobs: Sequence[J], rank: int, world: int) -> None:
        self.sends = pair_streams(jobs, rank, world, sending=True)
        self.recvs = pair_streams(jobs, rank, world, sending=False)
        self.send_len = [stream_len(s) for s in self.sends]
        self.recv_len = [stream_len(s) for s in self.recvs]

    def rounds_needed(self, budget: int | None) -> int:
        return max(rounds_needed(self.send_len, budget), rounds_needed(self.recv_len, budget))


def with_self(
    streams: Sequence[list[Entry[J]]], rank: int, mine: list[Entry[J]]
) -> list[list[Entry[J]]]:
    """``streams`` with ``mine`` (the local stream) as the stream of ``rank`` to itself."""
    out = list(streams)
    out[rank] = mine
    return out


def quotas(lengths: Sequence[int], rounds: int) -> list[int]:
    """Each stream's window size over ``rounds`` rounds (at least 1): a multiple of WINDOW."""
    return [align(-(-n // rounds)) for n in lengths]


def windows(
    quota: Sequence[int], lengths: Sequence[int], t: int, peers: Sequence[int] | None = None
) -> list[int]:
    """The bytes of each stream that round ``t`` moves: ``[t * q, (t + 1) * q)`` of it, cut
    at its end. ``peers``, when given, lists every stream that is not empty (:func:`peers_of`):
    only those are looked at, since a rank of a large world has a few peers among thousands of
    ranks and every round would otherwise cost a pass over all of them."""
    out = [0] * len(lengths)
    for i in range(len(lengths)) if peers is None else peers:
        lo = t * quota[i]
        if lo < lengths[i]:
            out[i] = min(lo + quota[i], lengths[i]) - lo
    return out


def peers_of(lengths: Sequence[int]) -> list[int]:
    """The streams of ``lengths`` that are not empty, in rank order."""
    return [i for i, n in enumerate(lengths) if n]


def buffer_bytes(quota: Sequence[int], lengths: Sequence[int]) -> int:
    """The size of a buffer that holds any round's windows of every stream."""
    return sum(min(q, n) for q, n in zip(quota, lengths))


def round_cuts(
    streams: Sequence[Sequence[Entry[J]]],
    ptr: list[int],
    quota: Sequence[int],
    splits: Sequence[int],
    t: int,
    peers: Sequence[int] | None = None,
) -> list[Cut[J]]:
    """Round ``t``'s buffer: each peer's next ``splits[peer]`` stream bytes, peer after peer,
    as the element ranges of the entries they hold. ``ptr`` keeps each peer's place in its
    stream from round to round (start at zeros, run the rounds in order). ``peers``, when
    given, lists every peer whose split may be non-zero, in rank order: the others hold no
    bytes and are passed over without a look."""
    return [cut for _, cuts in _windows_cut(streams, ptr, quota, splits, t, peers) for cut in cuts]


def _windows_cut(
    streams: Sequence[Sequence[Entry[J]]],
    ptr: list[int],
    quota: Sequence[int],
    splits: Sequence[int],
    t: int,
    peers: Sequence[int] | None,
) -> list[tuple[int, list[Cut[J]]]]:
    """(peer, its window's cuts) for every peer with bytes in round ``t``, in rank order."""
    out: list[tuple[int, list[Cut[J]]]] = []
    base = 0
    for peer in range(len(splits)) if peers is None else peers:
        n = splits[peer]
        if not n:
            continue
        lo = t * quota[peer]
        cuts: list[Cut[J]] = []
        ptr[peer] = _cut_window(streams[peer], ptr[peer], lo, lo + n, base, cuts)
        out.append((peer, cuts))
        base += n
    return out


# A cut of at least this many bytes travels as its own message (straight from the input and
# into the output where those hold it contiguously); smaller cuts travel together through the
# round's buffer. A gloo message costs about 55 us beyond its bytes here (4 ranks on 2 cores,
# 2026-11-30: 1,024 messages of 32 KiB a rank took 74 ms, one message of the same 32 MiB
# 16-18 ms), what the two copies it saves cost for about 150 KiB; a smaller cut is cheaper packed.
DIRECT_BYTES = 256 * 1024


@dataclass
class Message(Generic[J]):
    """One message of a round between this rank and ``peer``: the buffer bytes ``[lo, hi)``
    of the round, holding ``cuts``. ``direct``: a single cut of at least ``DIRECT_BYTES``
    bytes, which may travel without the buffer where its tensor holds it contiguously."""

    peer: int
    tag: int  # its place among this round's messages of the pair: the same on both ends
    lo: int
    hi: int
    cuts: list[Cut[J]]
    direct: bool


def round_messages(
    streams: Sequence[Sequence[Entry[J]]],
    ptr: list[int],
    quota: Sequence[int],
    splits: Sequence[int],
    t: int,
    peers: Sequence[int] | None,
    tags: list[int],
    direct_bytes: int = DIRECT_BYTES,
) -> list[Message[J]]:
    """Round ``t``'s cuts (as :func:`round_cuts`, same buffer positions) as messages, peer
    after peer: each cut of at least ``direct_bytes`` bytes alone, each run of smaller cuts
    between them as one message spanning them (padding between them included). Computed from
    the stream alone, so the sender and the receiver of a pair cut it into the same messages.
    A message's tag is its place among the pair's messages of every round so far (``tags``:
    one counter a peer, start at zeros, run the rounds in order), so the messages of two
    rounds in flight at once never share a tag."""
    out: list[Message[J]] = []
    for peer, cuts in _windows_cut(streams, ptr, quota, splits, t, peers):
        run: list[Cut[J]] = []
        tag = tags[peer]
        for cut in cuts:
            e, e0, e1, pos = cut
            size = (e1 - e0) * e.job.itemsize
            if size >= direct_bytes:
                if run:
                    out.append(Message(peer, tag, run[0][3], _end(run[-1]), run, False))
                    tag, run = tag + 1, []
                out.append(Message(peer, tag, pos, pos + size, [cut], True))
                tag += 1
            else:  # a cut is never empty (_cut_window)
                run.append(cut)
        if run:
            out.append(Message(peer, tag, run[0][3], _end(run[-1]), run, False))
            tag += 1
        tags[peer] = tag
    return out


def _end(cut: Cut[J]) -> int:
    e, e0, e1, pos = cut
    return pos + (e1 - e0) * e.job.itemsize


def _cut_window(
    entries: Sequence[Entry[J]], start: int, lo: int, hi: int, base: int, cuts: list[Cut[J]]
) -> int:
    """Append the cuts of the stream window ``[lo, hi)``, which starts at byte ``base`` of the
    buffer, to ``cuts``; return the first entry the next window still needs."""
    i = start
    while i < len(entries) and entries[i].offset < hi:
        e = entries[i]
        a, b = max(e.offset, lo), min(e.offset + e.nbytes, hi)
        if a < b:
            size = e.job.itemsize
            cuts.append((e, (a - e.offset) // size, (b - e.offset) // size, base + a - lo))
        if e.offset + e.nbytes > hi:
            break  # the rest of this piece goes in the next window
        i += 1
    return i


def piece_bytes(
    shape: Sequence[int], outer: Sequence[int], p: Piece, itemsize: int
) -> tuple[int, int] | None:
    """The byte range of piece ``p`` in a contiguous (row-major) tensor of ``shape`` whose box
    starts at ``outer``, or None if the piece is not one contiguous range of it."""
    stride = 1
    first = last = 0
    for size, o, po, ps in reversed(list(zip(shape, outer, p.offsets, p.sizes))):
        first += (po - o) * stride
        last += (po - o + ps - 1) * stride
        stride *= size
    if last - first + 1 != p.numel:
        return None
    return first * itemsize, (last + 1) * itemsize


def contiguous_span(
    streams: Sequence[Sequence[Entry[J]]],
    holder: Callable[[Entry[J]], tuple[T, Sequence[int], Sequence[int]] | None],
) -> tuple[T, int, int] | None:
    """One tensor and byte range ``[lo, hi)`` of it that holds every stream back to back, in
    order, or None. ``holder(entry)`` gives the tensor that holds the entry's piece, its shape
    and its box's offsets, or None when that tensor is not contiguous; tensors are compared
    with ``is``. Streams must carry no padding: each piece starts where the one before ends."""
    tensor: T | None = None
    started = False
    lo = hi = 0
    for entries in streams:
        end = 0
        for e in entries:
            if e.nbytes == 0:
                continue
            if e.offset != end:
                return None
            end += e.nbytes
            held = holder(e)
            if held is None:
                return None
            t, shape, outer = held
            if tensor is None:
                tensor = t
            elif t is not tensor:
                return None
            r = piece_bytes(shape, outer, e.piece, e.job.itemsize)
            if r is None:
                return None
            if not started:
                started, lo, hi = True, r[0], r[0]
            if r[0] != hi:
                return None
            hi = r[1]
    if tensor is None:
        return None
    return tensor, lo, hi
