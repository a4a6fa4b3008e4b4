"""The distributed executor: move tensors between layouts, a round at a time.

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
   the bytes they name (a piece's bytes in its tensors: :mod:`shardspec.reshard.pieces`).
   On gloo the rounds travel as point-to-point messages instead, each window cut into
   messages alike at both ends, a large piece sent from and received into its tensors in
   place (:mod:`shardspec.reshard.messages`); NCCL groups and simulated worlds use the
   all-to-all.
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
8. A call with ``max_buffer_bytes`` keeps its buffers for the next
   (:mod:`shardspec.reshard.buffers`; ``release_buffers()`` frees them).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
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
from .buffers import keep, kept_buffer, release_buffers
from .checks import check_device, check_tensors, find_overlap, has_internal_overlap
from .errors import ReshardError
from .messages import exchange_messages, point_to_point
from .pieces import (
    DIRECT_COUNTS,
    Job,
    Span,
    copy_local,
    copy_range,
    flat_bytes,
    send_scratch,
    span_of,
)
from .planner import Plan, plan
from .schedule import (
    Entry,
    Streams,
    buffer_bytes,
    local_stream,
    peers_of,
    quotas,
    round_cuts,
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
    jobs: list[Job] = []
    codes: list[int] = []
    streams: Streams[Job] | None = None
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


def _set_dtypes(jobs: list[Job], codes: Sequence[int]) -> None:
    import torch

    for job, code in zip(jobs, codes):
        job.dtype = dtype_from_code(code) if code else torch.get_default_dtype()
        job.itemsize = torch.empty((), dtype=job.dtype).element_size()


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
) -> tuple[Job, int]:
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
    return Job(key, src, dst, p, inputs, given=given), code


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


def _check_aliasing(jobs: list[Job], rank: int, names: Mapping[str, str] | None) -> None:
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


def _wire_buffer(
    span: Span | None,
    quota: list[int],
    lengths: list[int],
    dev: torch.device,
    side: str,
    held: list[torch.Tensor] | None,
) -> torch.Tensor:
    """One round's worth of wire bytes per peer, or the tensor ``span`` itself when the
    pieces already lie in it in wire order (no copy; counted in DIRECT_COUNTS[side]).
    ``held``: take the buffer from those kept since an earlier call (:mod:`.buffers`) and
    append it there, to be kept again after this one."""
    if span is None:
        return kept_buffer(buffer_bytes(quota, lengths), dev, held)
    buf = flat_bytes(span)
    assert buf.numel() == sum(lengths)
    DIRECT_COUNTS[side] += 1
    return buf


def _exchange(
    jobs: list[Job],
    streams: Streams[Job],
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
    p2p = point_to_point(group)
    if rounds == 1:
        mine = local_stream(jobs, rank)
        mine_len = stream_len(mine)
        recv_span = span_of(recvs, sending=False)
        send_span = span_of(sends, sending=True)
        # Sending the local pieces to ourselves must keep both buffers within the budget; over
        # point-to-point messages a rank does not send to itself.
        fits = not p2p and (
            budget is None or max(sum(send_len), sum(recv_len)) + mine_len <= budget
        )
        if recv_span is None and mine_len and fits and span_of([mine], sending=False):
            # The local pieces sit between the received ones: send them to ourselves.
            both = span_of(with_self(recvs, rank, mine), sending=False)
            if both is not None:
                recv_span, via_self = both, True
                send_span = span_of(with_self(sends, rank, mine), sending=True)
        if not via_self and send_span is None and recv_span is None and mine_len and fits:
            send_span = span_of(with_self(sends, rank, mine), sending=True)
            via_self = send_span is not None
        if via_self:
            sends, recvs = with_self(sends, rank, mine), with_self(recvs, rank, mine)
            send_len[rank] = recv_len[rank] = mine_len
            DIRECT_COUNTS["self"] += 1
    send_q = quotas(send_len, rounds) if rounds else []
    recv_q = quotas(recv_len, rounds) if rounds else []
    if p2p and rounds:
        spans = (send_span, recv_span)
        exchange_messages(jobs, streams, rounds, (send_q, recv_q), spans, rank, dev, budget, group)
        return
    scratch = None
    if rounds and send_span is None and not via_self:
        scratch = send_scratch(jobs, rank, buffer_bytes(send_q, send_len))
    if not via_self and scratch is None:
        copy_local(jobs, rank)
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
        copy_local(jobs, rank)
    if held:
        keep(held)


def _walk_round(
    pieces: list[list[Entry[Job]]],
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
        copy_range(e, e0, e1, buf, pos, pack=pack)
