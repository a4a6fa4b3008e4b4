"""The executor's rounds as point-to-point messages (gloo's transport, RESHARD-6): the same
streams and windows as one ``all_to_all_single`` a round (:mod:`shardspec.reshard.schedule`),
each window cut into messages alike at both ends (:func:`round_messages`); a large piece goes
straight from the tensor that holds it and into the output where those hold it contiguously,
the rest through a scratch buffer that bounded calls keep (:mod:`shardspec.reshard.buffers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .blocks import flat_blocks
from .buffers import keep, kept_buffer
from .pieces import (
    DIRECT_COUNTS,
    Job,
    Span,
    bytes_of,
    copy_local,
    copy_range,
    flat_bytes,
    holder,
    rel,
    run_bytes,
    send_scratch,
)
from .schedule import WINDOW, Message, Streams, peers_of, round_messages, windows

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["TRANSPORT", "exchange_messages", "point_to_point"]


# How rounds travel: "auto" (see point_to_point), or "all_to_all" / "messages" to force one
# (for the tests, which hold each transport's own paths; every rank of a call must agree).
TRANSPORT = "auto"


def point_to_point(group: dist.ProcessGroup | None) -> bool:
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
_Routed = tuple[Message[Job], "torch.Tensor | None"]


def _messages(
    streams: Streams[Job],
    send_q: list[int],
    recv_q: list[int],
    rounds: int,
    send_span: Span | None,
    recv_span: Span | None,
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


def _route(m: Message[Job], span: Span | None, *, sending: bool) -> torch.Tensor | None:
    if span is not None:
        # The tensor is the buffer (there is one round): the message's bytes are at its place.
        return flat_bytes(span)[m.lo : m.hi]
    return _direct(m, sending=sending) if m.direct else None


def exchange_messages(
    jobs: list[Job],
    streams: Streams[Job],
    rounds: int,
    quotas: tuple[list[int], list[int]],
    spans: tuple[Span | None, Span | None],
    rank: int,
    dev: torch.device,
    budget: int | None,
    group: dist.ProcessGroup | None,
) -> None:
    """The rounds as point-to-point messages (gloo), one after the other as the all-to-all's
    calls would be (see :func:`_message_round`). A message whose bytes its tensor holds
    contiguously travels from (into) the tensor; the others are packed into (unpacked from)
    a scratch buffer back to back, each send posted as soon as it is packed (see
    :func:`_packed_at`: never more than the all-to-all's buffer of the round). ``quotas``:
    each stream's window (sends, receives) over the agreed rounds; ``spans``: the tensor
    that is the whole send (receive) buffer, or None."""
    send_span, recv_span = spans
    routed = _messages(streams, *quotas, rounds, send_span, recv_span)
    send_need = max(_packed_end([m for m, b in sent if b is None]) for sent, _ in routed)
    recv_need = max(_packed_end([m for m, b in got if b is None]) for _, got in routed)
    held: list[torch.Tensor] | None = [] if budget is not None else None
    scratch = send_scratch(jobs, rank, send_need) if send_span is None else None
    if scratch is not None:
        DIRECT_COUNTS["scratch"] += 1
    else:
        copy_local(jobs, rank)
    send_buf = scratch if scratch is not None else kept_buffer(send_need, dev, held)
    recv_buf = kept_buffer(recv_need, dev, held)
    if send_span is not None:
        DIRECT_COUNTS["send"] += 1
    if recv_span is not None:
        DIRECT_COUNTS["recv"] += 1
    ahead = _post_direct(routed[0], group)
    for t, (sent, got) in enumerate(routed):
        following = routed[t + 1] if t + 1 < rounds else None
        ahead = _message_round(sent, got, send_buf, recv_buf, group, ahead, following)
    if scratch is not None:
        # Only now: until the last round the local pieces' place held the packed sends.
        copy_local(jobs, rank)
    if held:
        keep(held)


def _packed_at(pos: int, m: Message[Job]) -> int:
    """Where message ``m`` goes in a scratch whose previous message ends at ``pos``: the first
    place from there at the offset modulo 16 that it has in the all-to-all's buffer, so every
    cut keeps that buffer's alignment to its element size. Each message then starts at or
    before its place there, so a round's scratch is never larger than that buffer (within the
    budget, RESHARD-6)."""
    return pos + (m.lo - pos) % WINDOW


def _packed_end(messages: list[Message[Job]]) -> int:
    pos = 0
    for m in messages:
        pos = _packed_at(pos, m) + m.hi - m.lo
    return pos


def _op(
    fn: object, m: Message[Job], data: torch.Tensor, group: dist.ProcessGroup | None
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
    later: list[tuple[Message[Job], int]] = []
    pos = 0
    for m, data in got:
        if data is None:
            pos = _packed_at(pos, m)
            ops.append(_op(dist.irecv, m, recv_buf[pos : pos + m.hi - m.lo], group))
            later.append((m, pos))
            pos += m.hi - m.lo
    works = list(dist.batch_isend_irecv(ops)) if ops else []
    pos = 0
    for m, data in sent:
        if data is None:
            pos = _packed_at(pos, m)
            for e, e0, e1, at in m.cuts:
                copy_range(e, e0, e1, send_buf, pos + at - m.lo, pack=True)
            chunk = send_buf[pos : pos + m.hi - m.lo]
            works += dist.batch_isend_irecv([_op(dist.isend, m, chunk, group)])
            pos += m.hi - m.lo
    ahead = _post_direct(following, group) if following is not None else []
    for work in (*direct, *works):
        work.wait()
    for m, at in later:
        for e, e0, e1, cut in m.cuts:
            copy_range(e, e0, e1, recv_buf, at + cut - m.lo, pack=False)
    return ahead


def _direct(m: Message[Job], *, sending: bool) -> torch.Tensor | None:
    """The bytes of the message's one cut in its tensor, when they lie there contiguously."""
    ((e, e0, e1, _),) = m.cuts
    data = run_bytes(e, e0, e1, sending)  # a round's window may cut the piece: still a run
    if data is None:
        # a tensor held otherwise may still hold this cut as one contiguous block
        blocks = flat_blocks(e.piece.sizes, e0, e1)
        if len(blocks) != 1:
            return None
        tensor, outer = holder(e, sending)
        view = tensor[rel(e.piece, outer, blocks[0])]
        if not view.is_contiguous():
            return None
        data = bytes_of(view)
    DIRECT_COUNTS["sent directly" if sending else "received directly"] += 1
    return data
