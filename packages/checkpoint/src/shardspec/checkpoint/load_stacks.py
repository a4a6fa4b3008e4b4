"""Small tensors of one geometry read and moved as one stack by ``reads="once"`` (CKPT-24).

A model's tensors come in few geometries, and its thousands of small ones cost a load more in
per-tensor Python (a plan, runs, a job of the executor, pieces to pack) than in bytes: 2,000
tensors of 7.5 KiB moved 4 -> 4 took 0.67 s against 0.007 s for one all-to-all of their bytes
(spec/09-checkpoint.md, "Measured"). Tensors with the same dtype, shape, saved chunks and
destination layout (shard order included: it orders each rank's destination tensors) are one
*stack*: a tensor of shape ``(n, *shape)`` whose saved chunk ``i`` is chunk ``i`` of every
member, and whose destination boxes are the members' with the stack's dim whole. Its runs are
members' chunks at one position, read by one rank into one buffer; the executor moves it as one
tensor; each rank's members get their boxes from the stack's in one ``_foreach_copy_``.

Only what every rank sees alike decides the stacks (keys, metadata, layouts), so every rank
makes the same ones; a member's destination tensors (device, conj bit) only decide how its
values are copied in.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardspec.metadata import Box, Layout, Shard

from .dcp_reader import WHOLE_ITEM_BYTES
from .load_exchange import Target, whole_on_every_rank

__all__ = ["MEMBER_BYTES", "STACK_BYTES", "STACK_KEY", "stack_targets"]

# The keys of stacks, which no fqn starts with.
STACK_KEY = "\0stack:"
# A tensor joins a stack up to this size: each of its saved chunks is then read whole by
# chunk_spans, and above it a tensor's bytes, not its Python, are what it costs.
MEMBER_BYTES = WHOLE_ITEM_BYTES
# A stack holds members of at most this many bytes together (the rest of a geometry makes
# more stacks): its runs and this rank's boxes of it are new memory beside the destinations,
# and under NCCL one key of an exchange batch.
STACK_BYTES = 64 << 20


def stack_targets(targets: Sequence[Target], world: int) -> list[Target]:
    """``targets`` with the small tensors of each geometry shared by two or more replaced by
    stacked targets of at most :data:`STACK_BYTES` together (each at the place of its first
    member; its ``members`` in their order)."""
    by_geometry: dict[tuple[object, ...], list[int]] = {}
    for i, t in enumerate(targets):
        nbytes = t.dst.numel * t.saved.properties.dtype.itemsize
        if t.dst.numel == 0 or nbytes > MEMBER_BYTES or whole_on_every_rank(t.dst, world):
            continue  # nothing to move; large; broadcast as it is read
        geometry = (
            str(t.saved.properties.dtype),
            t.dst.shape,
            t.chunks.fingerprint(),
            t.dst.fingerprint(),
        )
        by_geometry.setdefault(geometry, []).append(i)
    first: dict[int, list[int]] = {}
    for ix in by_geometry.values():
        t = targets[ix[0]]
        nbytes = t.dst.numel * t.saved.properties.dtype.itemsize
        most = max(2, STACK_BYTES // nbytes)
        for k in range(0, len(ix), most):
            if len(ix[k : k + most]) > 1:
                first[ix[k]] = ix[k : k + most]
    taken = {i for ix in first.values() for i in ix}
    out: list[Target] = []
    for i, t in enumerate(targets):
        if i in first:
            out.append(_stack([targets[j] for j in first[i]], len(out)))
        elif i not in taken:
            out.append(t)
    return out


def _stack(members: list[Target], number: int) -> Target:
    head = members[0]
    n = len(members)
    return Target(
        key=f"{STACK_KEY}{number}",
        saved=head.saved,  # the members' dtype; its chunks are a member's, not stacked
        dst=_lifted(head.dst, n),
        outs=[],  # staging tensors, made where the exchange moves it
        chunks=_lifted(head.chunks, n),
        members=tuple(members),
    )


def _lifted(layout: Layout, n: int) -> Layout:
    """``layout`` of a ``(n, *shape)`` stack: every box with the stack's dim whole."""
    return Layout(
        (n, *layout.shape),
        tuple(Shard(Box((0, *s.box.offsets), (n, *s.box.sizes)), s.rank) for s in layout.shards),
    )
