"""The distributed executor: move tensors between layouts with ``all_to_all_single``.

How one call runs on every rank of the group:

1. Plan each tensor for this rank only (:func:`shardspec.reshard.plan` with ``rank``; a plan is
   kept for the next call between layouts of the same fingerprints), and
   check everything about this rank's own arguments (:mod:`shardspec.reshard.checks`: the
   device, and the count, shape, dtype, device, kind and aliasing of the source shards and
   ``out=`` tensors). Nothing raises yet: the verdict goes into step 2.
2. Agree (see :mod:`shardspec.reshard.agreement`): the call's number on the group, digests
   of keys, shapes, layouts and ``max_buffer_bytes``, each rank's input verdict, and (when
   it knows every dtype) a digest of the dtypes and the rounds it needs are all-gathered:
   usually the only extra collective.
   Otherwise the dtypes are gathered and the rounds all-reduced. With ``check_replicas``, one
   more all-gather compares a digest of every replicated source shard (RESHARD-13). Any
   problem raises the same error on every rank before data moves; an error several ranks
   share is shown once, after its ranks.
3. Local pieces are copied directly into the outputs (never sent to another rank): before the
   collectives, or after the last round when the sends are packed into their place (step 7).
4. Everything else travels as one byte stream per (sender, receiver) pair: the pieces of
   every tensor in key order, then wire order, each starting at a multiple of its own element
   size (so a stream of one dtype is the exact concatenation of its pieces' bytes; padding
   appears only where a wider dtype follows a narrower one). Round ``t`` moves the ``t``-th
   window of every pair's stream in one ``all_to_all_single`` over a flat ``uint8`` buffer
   (gloo accepts uneven split sizes there, unlike list ``all_to_all``). Windows start at
   multiples of 16 bytes (the largest element size) of the stream, so no element is cut; a
   piece cut by a window is copied as a few strided views
   (:func:`shardspec.reshard.blocks.flat_blocks`), never whole. Where a piece lands in the
   buffer depends on the other peers' windows, so it may sit at any byte offset: such pieces
   are copied as bytes, not through a typed view of the buffer. The streams, windows and
   rounds are plain integers computed by :mod:`shardspec.reshard.schedule`; this module moves
   the bytes they name.
5. The number of rounds is the maximum over ranks of what each rank needs to keep its send
   and its receive buffer within ``max_buffer_bytes`` (agreed in step 2), so all ranks run
   the same number of collectives.
6. In place, when it can be: with one round, if the bytes this rank receives are contiguous
   ranges of one contiguous output that follow each other in rank order (and no stream
   carries padding, true whenever the streams hold a single dtype), the output itself is the
   collective's receive buffer; likewise a contiguous input is the send buffer when the
   ranges it sends follow each other in rank order. If only this rank's own (local) pieces
   break the run, they travel through the collective to itself instead of being copied
   aside. Either is this rank's own affair: the bytes of every pair's stream and the split
   sizes are those of the general path.
7. When the sends must be packed and this rank's local pieces fill one range of one contiguous
   output back to back, at least as long as a round's send buffer, that range is the send
   buffer: no new memory. The local pieces are copied in after the last round.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardspec.metadata import Layout

from .agreement import (
    agree_on_dtypes,
    agree_on_inputs,
    agree_on_replicas,
    digests,
    dtype_code,
    dtype_from_code,
    key_name,
    next_call,
    replica_digests,
)
from .blocks import flat_blocks
from .checks import check_device, check_tensors, find_overlap, has_internal_overlap
from .errors import ReshardError
from .planner import Piece, Plan, plan
from .schedule import (
    Entry,
    Message,
    Streams,
    align,
    buffer_bytes,
    contiguous_span,
    local_stream,
    peers_of,
    piece_bytes,
    quotas,
    round_cuts,
    round_messages,
    stream_len,
    windows,
    with_self,
)

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["release_buffers", "reshard", "reshard_state_dict"]


def reshard(
    local_shards: Sequence[torch.Tensor],
    src: Layout,
    dst: Layout,
    group: dist.ProcessGroup | None = None,
    *,
    max_buffer_bytes: int | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    out: Sequence[torch.Tensor] | None = None,
    check_replicas: bool = False,
) -> list[torch.Tensor]:
    """This rank's shards of ``dst``, in ``dst``'s local order, from its shards of ``src``.

    Call on every rank of ``group`` (default: the world) with the same ``src``, ``dst`` and
    ``max_buffer_bytes``. Layout ranks are ranks within ``group``. ``local_shards`` are this
    rank's source tensors in ``src``'s local order (any strides). A rank that holds no source
    shard learns the dtype from the others (or pass ``dtype``); its outputs go to ``device``
    (default: CUDA for an NCCL group, else CPU).

    ``out``: tensors to write the result into (one per destination shard of this rank, of its
    shape and the tensors' dtype, on the outputs' device, sharing no memory with an input or
    another output), which are returned. Checked on every rank before data moves, like the
    inputs: any bad argument on any rank raises the same :class:`ReshardError` on every rank.

    Replicas: where ``src`` gives one box to several ranks, their copies are trusted to hold
    the same bytes, and each piece of the result is read from one of them (RESHARD-4), so
    copies that differ end up mixed in one output. ``check_replicas=True`` compares a digest
    of every replica before any data moves (one more all-gather, and every replicated shard
    hashed once) and raises the same :class:`ReshardError` on every rank, naming the tensor,
    the box and the ranks that hold each copy (RESHARD-13).
    """
    result = reshard_state_dict(
        {"": local_shards},
        {"": src},
        {"": dst},
        group,
        max_buffer_bytes=max_buffer_bytes,
        dtypes=None if dtype is None else {"": dtype},
        device=device,
        out=None if out is None else {"": out},
        names={"": ""},
        check_replicas=check_replicas,
    )
    return result[""]


def reshard_state_dict(
    state: Mapping[str, Sequence[torch.Tensor]],
    src_layouts: Mapping[str, Layout],
    dst_layouts: Mapping[str, Layout],
    group: dist.ProcessGroup | None = None,
    *,
    max_buffer_bytes: int | None = None,
    dtypes: Mapping[str, torch.dtype] | None = None,
    device: torch.device | str | None = None,
    out: Mapping[str, Sequence[torch.Tensor]] | None = None,
    names: Mapping[str, str] | None = None,
    check_replicas: bool = False,
) -> dict[str, list[torch.Tensor]]:
    """:func:`reshard` for many tensors at once: every tensor shares each round's collective.

    ``state[key]`` is this rank's list of source shards of tensor ``key`` (empty if it holds
    none). Every rank must pass the same keys and layouts. Returns this rank's destination
    shards of every key; with ``out`` (same keys), writes them into ``out[key]`` (see
    :func:`reshard`) and returns those tensors.

    ``names``: how error messages name a key, for keys a caller built from its own
    (``shardspec.fsdp.reshard_for`` names ``"optimizer state 'exp_avg' of parameter
    '0.bias'"``); by default ``tensor 'key'``. An empty name leaves the key out.
    ``check_replicas``: see :func:`reshard`; every rank must pass the same value.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    if rank < 0:
        raise ReshardError("reshard: this process is not a member of the group it was given")
    backend = str(dist.get_backend(group))
    # The agreement's own tensors live where the backend surely takes them, whatever the
    # caller's device argument says: checking that argument is part of the agreement.
    comm = torch.device("cpu")
    if backend == "nccl":
        comm = torch.device("cuda", torch.cuda.current_device())
    call = next_call(group)

    keys: list[str] = []
    error: str | None = None
    digest = b""
    jobs: list[_Job] = []
    codes: list[int] = []
    streams: Streams[_Job] | None = None
    need = 0
    replicas = b""
    dev = torch.device("cpu")
    try:
        keys = _check_keys(state, src_layouts, dst_layouts)
        if out is not None and set(out) != set(keys):
            raise ReshardError(
                f"out must have the keys of state; missing: {sorted(set(keys) - set(out))}, "
                f"extra: {sorted(set(out) - set(keys))}"
            )
        digest = digests(keys, src_layouts, dst_layouts, max_buffer_bytes, check_replicas)
        if max_buffer_bytes is not None and (
            isinstance(max_buffer_bytes, bool)
            or not isinstance(max_buffer_bytes, int)
            or max_buffer_bytes < 1
        ):
            raise ReshardError(
                f"max_buffer_bytes must be a positive int or None, got {max_buffer_bytes!r}"
            )
        dev = _pick_device(state, device, group, out)
        check_device(dev, backend, f"device {dev} (where rank {rank}'s outputs go)")
        for key in keys:
            job, code = _prepare(
                key,
                state[key],
                src_layouts[key],
                dst_layouts[key],
                rank,
                world,
                dtypes,
                None if out is None else out[key],
                dev,
                names,
            )
            jobs.append(job)
            codes.append(code)
        _check_aliasing(jobs, rank, names)
        if check_replicas:
            replicas = replica_digests(keys, src_layouts, {j.key: j.inputs for j in jobs}, rank)
        # Usually every rank knows every dtype (it holds a shard of each tensor, or was told),
        # and one all-gather settles everything: inputs, agreement, dtypes and the rounds.
        if all(codes):
            _set_dtypes(jobs, codes)
            streams = Streams(jobs, rank, world)
            need = streams.rounds_needed(max_buffer_bytes)
    except Exception as e:  # any local failure must reach the others, or they would hang
        error = f"{type(e).__name__}: {e}"
        streams = None
    rounds = agree_on_inputs(digest, error, group, comm, codes=codes, rounds=need, call=call)
    if rounds is None:
        resolved = agree_on_dtypes(keys, codes, group, comm, names)
        _set_dtypes(jobs, resolved)
        streams = Streams(jobs, rank, world)
        agreed = torch.tensor(
            [streams.rounds_needed(max_buffer_bytes)], dtype=torch.int64, device=comm
        )
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        rounds = int(agreed.item())
    assert streams is not None
    if check_replicas:
        agree_on_replicas(keys, src_layouts, replicas, group, comm, names)

    with torch.no_grad():
        for job in jobs:
            if job.given is None:
                job.outputs = [
                    torch.empty(box.sizes, dtype=job.dtype, device=dev)
                    for box in job.dst.boxes_of(rank)
                ]
            else:
                job.outputs = job.given
        _exchange(jobs, streams, rounds, rank, world, group, dev, max_buffer_bytes)
    return {job.key: job.outputs for job in jobs}


def _set_dtypes(jobs: list[_Job], codes: Sequence[int]) -> None:
    import torch

    for job, code in zip(jobs, codes):
        job.dtype = dtype_from_code(code) if code else torch.get_default_dtype()
        job.itemsize = torch.empty((), dtype=job.dtype).element_size()


@dataclass
class _Job:
    key: str
    src: Layout
    dst: Layout
    plan: Plan
    inputs: list[torch.Tensor]
    dtype: torch.dtype | None = None
    itemsize: int = 0
    outputs: list[torch.Tensor] = field(default_factory=list)
    given: list[torch.Tensor] | None = None  # the caller's ``out`` tensors


def _pick_device(
    state: Mapping[str, Sequence[torch.Tensor]],
    device: torch.device | str | None,
    group: dist.ProcessGroup | None,
    out: Mapping[str, Sequence[torch.Tensor]] | None = None,
) -> torch.device:
    import torch
    import torch.distributed as dist

    if device is not None:
        if not isinstance(device, (torch.device, str)):
            raise ReshardError(f"device must be a torch.device or str, got {device!r}")
        try:
            dev = torch.device(device)
        except RuntimeError as e:  # "bogus": torch's own words say what it expected
            raise ReshardError(f"device {device!r} is not a device: {e}") from None
        if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev
    for tensors in (*state.values(), *(out or {}).values()):
        for t in tensors:
            if isinstance(t, torch.Tensor):
                return t.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_keys(
    state: Mapping[str, Sequence[torch.Tensor]],
    src: Mapping[str, Layout],
    dst: Mapping[str, Layout],
) -> list[str]:
    if set(state) != set(src) or set(src) != set(dst):
        raise ReshardError(
            "state, src_layouts and dst_layouts must have the same keys; "
            f"only in state: {sorted(set(state) - set(src))}, only in src_layouts: "
            f"{sorted(set(src) - set(state))}, differing dst_layouts: {sorted(set(src) ^ set(dst))}"
        )
    for k in src:
        if not isinstance(k, str):
            raise ReshardError(f"state keys must be str, got {k!r}")
    return sorted(src)


def _prepare(
    key: str,
    tensors: Sequence[torch.Tensor],
    src: Layout,
    dst: Layout,
    rank: int,
    world: int,
    dtypes: Mapping[str, torch.dtype] | None,
    out: Sequence[torch.Tensor] | None = None,
    dev: torch.device | None = None,
    names: Mapping[str, str] | None = None,
) -> tuple[_Job, int]:
    what = _prefix(key, names, ": ")
    if not isinstance(src, Layout) or not isinstance(dst, Layout):
        raise ReshardError(f"{what}src and dst must be Layouts")
    for name, layout in (("source", src), ("destination", dst)):
        bad = [r for r in layout.ranks if r >= world]
        if bad:
            raise ReshardError(
                f"{what}the {name} layout names ranks {bad}, but the group has {world} ranks"
            )
    p = _plan(src, dst, rank)
    inputs = _tensor_list(tensors, f"{what}the local shards of rank {rank}")
    dtype = None if dtypes is None else dtypes.get(key)
    dtype = check_tensors(
        inputs, src.boxes_of(rank), dtype, what, rank, "local shard", "local shards", "source"
    )
    for i, t in enumerate(inputs):
        if dev is not None and t.device != dev:
            raise ReshardError(
                f"{what}local shard #{i} on rank {rank} is on {t.device}, but the outputs go "
                f"to {dev}: pass the shards on one device and device= only where they are"
            )
    given = None
    if out is not None:
        given = _tensor_list(out, f"{what}the out tensors of rank {rank}")
        # A rank without source shards learns the dtype from its out tensors; a clash with
        # another rank's dtype is then caught by the dtype agreement.
        dtype = check_tensors(
            given, dst.boxes_of(rank), dtype, what, rank, "out", "out tensors", "destination"
        )
        for i, t in enumerate(given):
            if dev is not None and t.device != dev:
                raise ReshardError(
                    f"{what}out #{i} on rank {rank} is on {t.device}, the outputs go to {dev}"
                )
    code = dtype_code(dtype) if dtype is not None else 0
    return _Job(key, src, dst, p, inputs, given=given), code


# This process's plans by (source fingerprint, destination fingerprint, rank): a state dict's
# layers repeat their layouts, and a job reshards the same state dict again (every checkpoint
# load, every refit); planning a small tensor costs about 0.1 ms, most of a reshard of many
# small tensors. The fingerprints are the agreement's (computed once a layout); a plan is
# pieces of integers, valid for any layout of the same fingerprint, which was validated when
# it was planned. Bounded in plans and in pieces (a piece is about 250 bytes: 2^18 of them
# about 64 MiB; a plan larger than that alone is not kept), least recent first out; locked: a
# simulated world's ranks are threads.
_PLANS: OrderedDict[tuple[bytes, bytes, int], Plan] = OrderedDict()
_PLANS_MAX = 4096
_PLANS_PIECES = 1 << 18
_PLANS_LOCK = threading.Lock()
_plans_held = [0]  # pieces in _PLANS


def _plan(src: Layout, dst: Layout, rank: int) -> Plan:
    if not isinstance(src, Layout) or not isinstance(dst, Layout):
        return plan(src, dst, rank)  # refused there, with its message
    key = (src.fingerprint(), dst.fingerprint(), rank)
    with _PLANS_LOCK:
        hit = _PLANS.get(key)
        if hit is not None:
            _PLANS.move_to_end(key)
            return hit
    made = plan(src, dst, rank)
    size = len(made.pieces)
    if size > _PLANS_PIECES:
        return made
    with _PLANS_LOCK:
        if key not in _PLANS:
            _PLANS[key] = made
            _plans_held[0] += size
        while len(_PLANS) > _PLANS_MAX or _plans_held[0] > _PLANS_PIECES:
            _, old = _PLANS.popitem(last=False)
            _plans_held[0] -= len(old.pieces)
    return made


def _tensor_list(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    import torch

    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise ReshardError(
            f"{what} must be a list of tensors (one per box), got a {type(tensors).__name__}"
        )
    return list(tensors)


def _prefix(key: str, names: Mapping[str, str] | None, sep: str) -> str:
    """The key's name and ``sep`` to start a message with; nothing for the one tensor of
    :func:`reshard` (or a key its caller named "")."""
    if names is not None and key in names and not names[key]:
        return ""
    return key_name(key, names) + sep


def _check_aliasing(jobs: list[_Job], rank: int, names: Mapping[str, str] | None) -> None:
    """``out`` tensors are written while inputs are still being read, and a tensor written
    twice keeps one of the values: any memory shared with an input or another output would
    return wrong data with no error."""
    inputs = []
    outputs = []
    for job in jobs:
        what = _prefix(job.key, names, " ")
        inputs += [(f"{what}local shard #{i}", t) for i, t in enumerate(job.inputs)]
        for i, t in enumerate(job.given or ()):
            name = f"{what}out #{i}"
            if has_internal_overlap(t):
                raise ReshardError(
                    f"{name} on rank {rank} has elements that share memory (an expanded "
                    "tensor?): every element of an output must be its own"
                )
            outputs.append((name, t))
    if outputs:
        clash = find_overlap(inputs, outputs)
        if clash is not None:
            raise ReshardError(
                f"on rank {rank}, {clash}: out= tensors must not overlap the inputs or each other"
            )


def _rel(
    piece: Piece, outer_offsets: tuple[int, ...], block: tuple[tuple[int, ...], tuple[int, ...]]
) -> tuple[slice, ...]:
    offs, sizes = block
    return tuple(
        slice(po - oo + b, po - oo + b + s)
        for po, oo, b, s in zip(piece.offsets, outer_offsets, offs, sizes)
    )


def _copy(job: _Job, p: Piece, src_t: torch.Tensor, dst_t: torch.Tensor) -> None:
    whole = ((0,) * len(p.sizes), p.sizes)
    src_off = job.src.shards[p.src_shard].box.offsets
    dst_off = job.dst.shards[p.dst_shard].box.offsets
    dst_t[_rel(p, dst_off, whole)].copy_(src_t[_rel(p, src_off, whole)])


# How often an exchange used a tensor itself as the receive / send buffer, or packed its sends
# into the local pieces' place in an output (scratch), on this process: a debug hook for the
# tests (the only way to tell the paths apart from outside is memory).
DIRECT_COUNTS = {
    "recv": 0,
    "send": 0,
    "self": 0,
    "scratch": 0,
    "sent directly": 0,
    "received directly": 0,
}

_Span = tuple["torch.Tensor", int, int]  # a contiguous tensor and a byte range [lo, hi) of it


def _span(streams: list[list[Entry[_Job]]], sending: bool) -> _Span | None:
    """The tensor and byte range that holds every stream back to back, in order, or None
    (see :func:`shardspec.reshard.schedule.contiguous_span`): the inputs when ``sending``, else the
    outputs."""
    return contiguous_span(streams, _held_input if sending else _held_output)


def _held_input(e: Entry[_Job]) -> tuple[torch.Tensor, Sequence[int], Sequence[int]] | None:
    job, p = e.job, e.piece
    t = job.inputs[p.src_local]
    return (t, t.shape, job.src.shards[p.src_shard].box.offsets) if t.is_contiguous() else None


def _held_output(e: Entry[_Job]) -> tuple[torch.Tensor, Sequence[int], Sequence[int]] | None:
    job, p = e.job, e.piece
    t = job.outputs[p.dst_local]
    return (t, t.shape, job.dst.shards[p.dst_shard].box.offsets) if t.is_contiguous() else None


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a 1-d uint8 view. Not ``reshape(-1)``: a
    contiguous tensor may keep any stride on a dimension of size 1, and a dtype view needs
    stride 1."""
    import torch

    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def _wire_buffer(
    span: _Span | None,
    quota: list[int],
    lengths: list[int],
    dev: torch.device,
    side: str,
    held: list[torch.Tensor] | None,
) -> torch.Tensor:
    """One round's worth of wire bytes per peer, or the tensor ``span`` itself when the
    pieces already lie in it in wire order (no copy; counted in DIRECT_COUNTS[side]).
    ``held``: take the buffer from those kept since an earlier call (see :data:`_KEPT`) and
    append it there, to be kept again after this one."""
    import torch

    if span is None:
        size = buffer_bytes(quota, lengths)
        if held is None:
            return torch.empty(size, dtype=torch.uint8, device=dev)
        if size == 0:
            return torch.empty(0, dtype=torch.uint8, device=dev)
        buf = _take_kept(size, dev)
        held.append(buf)
        return buf[:size]
    buf = _flat_bytes(span)
    assert buf.numel() == sum(lengths)
    DIRECT_COUNTS[side] += 1
    return buf


# Wire buffers kept between calls made with max_buffer_bytes (which bounds them: at most two
# a device, a send and a receive buffer, each a round's bytes): a new buffer is fresh memory
# the kernel zero-fills page by page as it is first written, and packing a round into it
# cost 2-4x packing into memory touched before (see _send_scratch), once per call. A job
# that reshards or refits every step keeps them, as engines keep their transfer buffers;
# :func:`release_buffers` returns them. Locked: a simulated world's ranks are threads.
_KEPT: dict[str, list[torch.Tensor]] = {}
_KEPT_PER_DEVICE = 2
_KEPT_LOCK = threading.Lock()


def _take_kept(size: int, dev: torch.device) -> torch.Tensor:
    import torch

    with _KEPT_LOCK:
        free = _KEPT.get(str(dev), [])
        fits = [i for i, b in enumerate(free) if b.numel() >= size]
        if fits:
            return free.pop(min(fits, key=lambda i: free[i].numel()))
    return torch.empty(size, dtype=torch.uint8, device=dev)


def _keep(buffers: list[torch.Tensor]) -> None:
    with _KEPT_LOCK:
        for buf in buffers:
            free = _KEPT.setdefault(str(buf.device), [])
            free.append(buf)
            free.sort(key=lambda b: -b.numel())
            del free[_KEPT_PER_DEVICE:]


def release_buffers() -> None:
    """Free the wire buffers the executor kept from calls made with ``max_buffer_bytes``."""
    with _KEPT_LOCK:
        _KEPT.clear()


def _flat_bytes(span: _Span) -> torch.Tensor:
    t, lo, hi = span
    return _bytes_of(t)[lo:hi]


def _exchange(
    jobs: list[_Job],
    streams: Streams[_Job],
    rounds: int,
    rank: int,
    world: int,
    group: dist.ProcessGroup | None,
    dev: torch.device,
    budget: int | None,
) -> None:
    import torch.distributed as dist

    sends, recvs = streams.sends, streams.recvs
    send_len, recv_len = list(streams.send_len), list(streams.recv_len)
    recv_span = send_span = None
    via_self = False
    p2p = _point_to_point(group)
    if rounds == 1:
        mine = local_stream(jobs, rank)
        mine_len = stream_len(mine)
        recv_span = _span(recvs, sending=False)
        send_span = _span(sends, sending=True)
        # Sending the local pieces to ourselves must keep both buffers within the budget; over
        # point-to-point messages a rank does not send to itself.
        fits = not p2p and (
            budget is None or max(sum(send_len), sum(recv_len)) + mine_len <= budget
        )
        if recv_span is None and mine_len and fits and _span([mine], sending=False):
            # The local pieces sit between the received ones: send them to ourselves.
            both = _span(with_self(recvs, rank, mine), sending=False)
            if both is not None:
                recv_span, via_self = both, True
                send_span = _span(with_self(sends, rank, mine), sending=True)
        if not via_self and send_span is None and recv_span is None and mine_len and fits:
            send_span = _span(with_self(sends, rank, mine), sending=True)
            via_self = send_span is not None
        if via_self:
            sends, recvs = with_self(sends, rank, mine), with_self(recvs, rank, mine)
            send_len[rank] = recv_len[rank] = mine_len
            DIRECT_COUNTS["self"] += 1
    send_q = quotas(send_len, rounds) if rounds else []
    recv_q = quotas(recv_len, rounds) if rounds else []
    if p2p and rounds:
        rounds_of = _messages(streams, send_q, recv_q, rounds, send_span, recv_span)
        _exchange_messages(jobs, rounds_of, rank, dev, budget, send_span, recv_span, group)
        return
    scratch = None
    if rounds and send_span is None and not via_self:
        scratch = _send_scratch(jobs, rank, buffer_bytes(send_q, send_len))
    if not via_self and scratch is None:
        _copy_local(jobs, rank)
    if rounds == 0:
        return
    held: list[torch.Tensor] | None = [] if budget is not None else None
    if scratch is not None:
        send_buf = scratch
        DIRECT_COUNTS["scratch"] += 1
    else:
        send_buf = _wire_buffer(send_span, send_q, send_len, dev, "send", held)
    recv_buf = _wire_buffer(recv_span, recv_q, recv_len, dev, "recv", held)
    send_ptr = [0] * world
    recv_ptr = [0] * world
    send_peers, recv_peers = peers_of(send_len), peers_of(recv_len)
    for t in range(rounds):
        in_splits = windows(send_q, send_len, t, send_peers)
        out_splits = windows(recv_q, recv_len, t, recv_peers)
        if send_span is None:
            _walk_round(sends, send_ptr, send_q, in_splits, t, send_buf, send_peers, pack=True)
        dist.all_to_all_single(
            recv_buf[: sum(out_splits)],
            send_buf[: sum(in_splits)],
            output_split_sizes=out_splits,
            input_split_sizes=in_splits,
            group=group,
        )
        if recv_span is None:
            _walk_round(recvs, recv_ptr, recv_q, out_splits, t, recv_buf, recv_peers, pack=False)
    if scratch is not None:
        # Only now: until the last round the local pieces' place held the packed sends.
        _copy_local(jobs, rank)
    if held:
        _keep(held)


# How rounds travel: "auto" (see _point_to_point), or "all_to_all" / "messages" to force one
# (for the tests, which hold each transport's own paths; every rank of a call must agree).
TRANSPORT = "auto"


def _point_to_point(group: dist.ProcessGroup | None) -> bool:
    """Whether the rounds travel as point-to-point messages rather than one
    ``all_to_all_single``: on gloo, whose all-to-all is itself one send and one receive a
    pair, so messages cost the same and let large pieces skip the buffer. Not on NCCL (its
    all-to-all stays the transport there until a GPU run measures the other) nor on a
    simulated world's threaded group, which has no send."""
    import torch.distributed as dist

    if TRANSPORT != "auto":
        return TRANSPORT == "messages"
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if "multi_threaded" in type(pg).__module__:
        return False
    return str(dist.get_backend(group)) == "gloo"


# One message of a round and where its bytes are on this rank: its tensor's own bytes (a
# direct message whose tensor holds the cut contiguously, or the tensor that is the whole
# buffer), or None (packed into / unpacked from the round's scratch).
_Routed = tuple[Message[_Job], "torch.Tensor | None"]


def _messages(
    streams: Streams[_Job],
    send_q: list[int],
    recv_q: list[int],
    rounds: int,
    send_span: _Span | None,
    recv_span: _Span | None,
) -> list[tuple[list[_Routed], list[_Routed]]]:
    """Every round's messages (sent, received), each with the bytes it travels from or into
    where no copy is needed (see _Routed)."""
    send_len, recv_len = streams.send_len, streams.recv_len
    send_ptr, recv_ptr = [0] * len(send_len), [0] * len(recv_len)
    send_tags, recv_tags = [0] * len(send_len), [0] * len(recv_len)
    send_peers, recv_peers = peers_of(send_len), peers_of(recv_len)
    out = []
    for t in range(rounds):
        in_splits = windows(send_q, send_len, t, send_peers)
        out_splits = windows(recv_q, recv_len, t, recv_peers)
        sent = round_messages(streams.sends, send_ptr, send_q, in_splits, t, send_peers, send_tags)
        got = round_messages(streams.recvs, recv_ptr, recv_q, out_splits, t, recv_peers, recv_tags)
        out.append(
            (
                [(m, _route(m, send_span, sending=True)) for m in sent],
                [(m, _route(m, recv_span, sending=False)) for m in got],
            )
        )
    return out


def _route(m: Message[_Job], span: _Span | None, *, sending: bool) -> torch.Tensor | None:
    if span is not None:
        # The tensor is the buffer (there is one round): the message's bytes are at its place.
        return _flat_bytes(span)[m.lo : m.hi]
    return _direct(m, sending=sending) if m.direct else None


def _exchange_messages(
    jobs: list[_Job],
    rounds: list[tuple[list[_Routed], list[_Routed]]],
    rank: int,
    dev: torch.device,
    budget: int | None,
    send_span: _Span | None,
    recv_span: _Span | None,
    group: dist.ProcessGroup | None,
) -> None:
    """The rounds as point-to-point messages (gloo), one after the other as the all-to-all's
    calls would be (see :func:`_message_round`). A message whose bytes its tensor holds
    contiguously travels from (into) the tensor; the others are packed into (unpacked from)
    a scratch buffer back to back, each send posted as soon as it is packed. The scratch
    holds only what a round packs (each message at a multiple of 16 bytes), so about the
    round's window at most."""
    send_need = max(sum(align(m.hi - m.lo) for m, b in sent if b is None) for sent, _ in rounds)
    recv_need = max(sum(align(m.hi - m.lo) for m, b in got if b is None) for _, got in rounds)
    held: list[torch.Tensor] | None = [] if budget is not None else None
    scratch = _send_scratch(jobs, rank, send_need) if send_span is None else None
    if scratch is not None:
        DIRECT_COUNTS["scratch"] += 1
    else:
        _copy_local(jobs, rank)
    send_buf = scratch if scratch is not None else _scratch(send_need, dev, held)
    recv_buf = _scratch(recv_need, dev, held)
    if send_span is not None:
        DIRECT_COUNTS["send"] += 1
    if recv_span is not None:
        DIRECT_COUNTS["recv"] += 1
    ahead = _post_direct(rounds[0], group)
    for t, (sent, got) in enumerate(rounds):
        following = rounds[t + 1] if t + 1 < len(rounds) else None
        ahead = _message_round(sent, got, send_buf, recv_buf, group, ahead, following)
    if scratch is not None:
        # Only now: until the last round the local pieces' place held the packed sends.
        _copy_local(jobs, rank)
    if held:
        _keep(held)


def _scratch(size: int, dev: torch.device, held: list[torch.Tensor] | None) -> torch.Tensor:
    import torch

    if size == 0 or held is None:
        return torch.empty(size, dtype=torch.uint8, device=dev)
    buf = _take_kept(size, dev)
    held.append(buf)
    return buf[:size]


def _op(
    fn: object, m: Message[_Job], data: torch.Tensor, group: dist.ProcessGroup | None
) -> dist.P2POp:
    import torch.distributed as dist

    return dist.P2POp(fn, data, group=group, tag=m.tag, group_peer=m.peer)  # type: ignore[arg-type]


def _post_direct(
    messages: tuple[list[_Routed], list[_Routed]], group: dist.ProcessGroup | None
) -> list[dist.Work]:
    """Post a round's messages that need no buffer (receives first)."""
    import torch.distributed as dist

    sent, got = messages
    ops = [_op(dist.irecv, m, data, group) for m, data in got if data is not None]
    ops += [_op(dist.isend, m, data, group) for m, data in sent if data is not None]
    return list(dist.batch_isend_irecv(ops)) if ops else []


def _message_round(
    sent: list[_Routed],
    got: list[_Routed],
    send_buf: torch.Tensor,
    recv_buf: torch.Tensor,
    group: dist.ProcessGroup | None,
    direct: list[dist.Work],
    following: tuple[list[_Routed], list[_Routed]] | None,
) -> list[dist.Work]:
    """One round: its messages that need no buffer were posted already (``direct``, a round
    ahead); its buffered receives are posted, its buffered sends packed and posted one by one,
    then the next round's direct messages, so that the wire does not drain between rounds;
    then this round's are awaited and unpacked. Returns the next round's posted messages.

    Every rank posts all of round ``t``'s messages (and ``t + 1``'s direct ones) before it
    waits on any of round ``t``, and waits on nothing of a later round: so whatever a rank
    waits on, its peer has posted or will post before waiting itself, and no rank waits for
    one that waits for it. gloo moves a message's bytes once both ends have posted it."""
    import torch.distributed as dist

    ops = []
    later: list[tuple[Message[_Job], int]] = []
    pos = 0
    for m, data in got:
        if data is None:
            ops.append(_op(dist.irecv, m, recv_buf[pos : pos + m.hi - m.lo], group))
            later.append((m, pos))
            pos += align(m.hi - m.lo)
    works = list(dist.batch_isend_irecv(ops)) if ops else []
    pos = 0
    for m, data in sent:
        if data is None:
            for e, e0, e1, at in m.cuts:
                _copy_range(e, e0, e1, send_buf, pos + at - m.lo, pack=True)
            chunk = send_buf[pos : pos + m.hi - m.lo]
            works += dist.batch_isend_irecv([_op(dist.isend, m, chunk, group)])
            pos += align(m.hi - m.lo)
    ahead = _post_direct(following, group) if following is not None else []
    for work in (*direct, *works):
        work.wait()
    for m, at in later:
        for e, e0, e1, cut in m.cuts:
            _copy_range(e, e0, e1, recv_buf, at + cut - m.lo, pack=False)
    return ahead


def _direct(m: Message[_Job], *, sending: bool) -> torch.Tensor | None:
    """The bytes of the message's one cut in its tensor, when they lie there contiguously."""
    ((e, e0, e1, _),) = m.cuts
    job, p = e.job, e.piece
    tensor, outer = _holder(e, sending)
    whole = tensor[_rel(p, outer, ((0,) * len(p.sizes), p.sizes))]
    if whole.is_contiguous():
        # any run of a contiguous piece's elements is contiguous (a round's window may cut it)
        data = _bytes_of(whole)[e0 * job.itemsize : e1 * job.itemsize]
    else:
        blocks = flat_blocks(p.sizes, e0, e1)
        if len(blocks) != 1:
            return None
        view = tensor[_rel(p, outer, blocks[0])]
        if not view.is_contiguous():
            return None
        data = _bytes_of(view)
    DIRECT_COUNTS["sent directly" if sending else "received directly"] += 1
    return data


def _copy_local(jobs: list[_Job], rank: int) -> None:
    for job in jobs:
        for p in job.plan.local(rank):
            _copy(job, p, job.inputs[p.src_local], job.outputs[p.dst_local])


def _send_scratch(jobs: list[_Job], rank: int, size: int) -> torch.Tensor | None:
    """Where the sends can be packed without new memory: the bytes of an output that only this
    rank's local pieces fill, back to back, when there are at least ``size`` of them; else None.

    A new send buffer is fresh anonymous memory, which the kernel zero-fills page by page on
    first touch: a strided copy of 128 MiB into new memory took 4.6x the same copy into touched
    memory here (0.35 s against 0.076 s, 2026-11-29), and packing into a new buffer was most of
    ``load(reads="once")``'s exchange beyond one ``all_to_all_single`` of its bytes.
    The local pieces' place in the outputs is memory the call writes anyway, that no received
    byte lands in (every output element comes from one piece) and that shares nothing with an
    input (RESHARD-9), so it holds the sends until the last round and the local pieces are
    copied in after it."""
    if size == 0:
        return None
    span = _span([local_stream(jobs, rank)], sending=False)
    if span is None or span[2] - span[1] < size:
        return None
    return _flat_bytes(span)[:size]


def _walk_round(
    pieces: list[list[Entry[_Job]]],
    ptr: list[int],
    quota: list[int],
    splits: list[int],
    t: int,
    buf: torch.Tensor,
    peers: list[int],
    *,
    pack: bool,
) -> None:
    """Round ``t``: pack each peer's next ``splits[peer]`` wire bytes into ``buf`` (or unpack
    them from it), peer after peer; ``ptr`` keeps each peer's place in its pieces."""
    for e, e0, e1, pos in round_cuts(pieces, ptr, quota, splits, t, peers):
        _copy_range(e, e0, e1, buf, pos, pack=pack)


def _holder(e: Entry[_Job], sending: bool) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tensor that holds the entry's piece on this rank (its input when ``sending``, else
    its output) and the offsets of that tensor's box."""
    job, p = e.job, e.piece
    if sending:
        return job.inputs[p.src_local], job.src.shards[p.src_shard].box.offsets
    return job.outputs[p.dst_local], job.dst.shards[p.dst_shard].box.offsets


def _copy_range(
    e: Entry[_Job], e0: int, e1: int, buf: torch.Tensor, pos: int, *, pack: bool
) -> None:
    import torch

    job, p = e.job, e.piece
    assert job.dtype is not None
    tensor, outer = _holder(e, pack)
    span = piece_bytes(tensor.shape, outer, p, job.itemsize) if tensor.is_contiguous() else None
    if span is not None:
        # The piece is one run of its tensor's bytes (so is any run of its elements): one
        # byte copy, whatever the alignment; most pieces of a state dict of small tensors.
        mine = _bytes_of(tensor)[span[0] + e0 * job.itemsize : span[0] + e1 * job.itemsize]
        raw = buf[pos : pos + mine.numel()]
        if pack:
            raw.copy_(mine)
        else:
            mine.copy_(raw)
        return
    for block in flat_blocks(p.sizes, e0, e1):
        n = math.prod(block[1]) * job.itemsize
        view = tensor[_rel(p, outer, block)]
        raw = buf[pos : pos + n]
        if (buf.storage_offset() + pos) % job.itemsize == 0:
            wire = raw.view(job.dtype).view(block[1])
            if pack:
                wire.copy_(view)
            else:
                view.copy_(wire)
        else:
            # A typed view of bytes needs an offset that is a multiple of the element size;
            # copy bytes instead, through a contiguous scratch block when the view is strided.
            if pack:
                raw.copy_(_bytes_of(view.contiguous()))
            elif view.is_contiguous():
                _bytes_of(view).copy_(raw)
            else:
                scratch = torch.empty(block[1], dtype=job.dtype, device=view.device)
                _bytes_of(scratch).copy_(raw)
                view.copy_(scratch)
        pos += n
