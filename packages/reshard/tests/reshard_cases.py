"""Cases for the executor tests: seeded random layouts and tensors (driver side) and the
functions the ranks run (rank side). Deterministic: a seed gives the same cases everywhere."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.reshard import messages, reshard, reshard_state_dict
from shardspec.testing.tensors import random_tensor

DTYPES = [
    torch.float32,
    torch.bool,
    torch.complex64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.uint8,
    torch.float64,
    torch.int8,
    torch.complex128,
    torch.int32,
    torch.int16,
    torch.float8_e4m3fn,
    torch.uint16,
    torch.uint32,
]


# ---------------------------------------------------------------- driver side: generation


def random_shape(rng: random.Random, max_dims: int = 3, max_side: int = 7) -> tuple[int, ...]:
    nd = rng.randint(0, max_dims)
    return tuple(
        rng.choice([0, 1, 2, 3, 5, max_side]) if rng.random() < 0.3 else rng.randint(1, max_side)
        for _ in range(nd)
    )


def random_ranks(rng: random.Random, world: int, k: int | None = None) -> list[int]:
    k = k if k is not None else rng.randint(1, world)
    return rng.sample(range(world), k)


def _partition(rng: random.Random, n: int) -> list[tuple[int, int]]:
    parts = rng.randint(1, 4)
    cuts = sorted(rng.randint(0, n) for _ in range(parts - 1))
    edges = [0, *cuts, n]
    return list(itertools.pairwise(edges))


def _dedupe(shape: tuple[int, ...], shards: list[Shard]) -> Layout:
    seen: set[tuple[Box, int]] = set()
    out = []
    for s in shards:
        if (s.box, s.rank) not in seen:
            seen.add((s.box, s.rank))
            out.append(s)
    return Layout(shape, out)


def random_layout(rng: random.Random, shape: tuple[int, ...], world: int) -> Layout:
    """Chunked (any dim, any subset and order of ranks), grid, guillotine or replicated,
    optionally with extra replicas and shuffled shard order; ranks < world."""
    kinds = ["grid", "replicated"] + (["chunk", "chunk", "guillotine"] if shape else [])
    kind = rng.choice(kinds)
    if kind == "chunk":
        layout = chunk_layout(shape, rng.randrange(len(shape)), random_ranks(rng, world))
    elif kind == "replicated":
        layout = Layout.replicated(shape, random_ranks(rng, world))
    elif kind == "grid":
        cells = [Box((), ())]
        for n in shape:
            cells = [
                Box((*c.offsets, a), (*c.sizes, b - a))
                for c in cells
                for a, b in _partition(rng, n)
            ]
        layout = _dedupe(shape, [Shard(c, rng.randrange(world)) for c in cells])
    else:
        pieces = [Box.full(shape)]
        for _ in range(rng.randint(0, 5)):
            i = rng.randrange(len(pieces))
            p = pieces[i]
            d = rng.randrange(len(shape))
            at = rng.randint(0, p.sizes[d])
            left = Box(p.offsets, p.sizes[:d] + (at,) + p.sizes[d + 1 :])
            right = Box(
                p.offsets[:d] + (p.offsets[d] + at,) + p.offsets[d + 1 :],
                p.sizes[:d] + (p.sizes[d] - at,) + p.sizes[d + 1 :],
            )
            pieces[i : i + 1] = [left, right]
        layout = _dedupe(shape, [Shard(p, rng.randrange(world)) for p in pieces])
    shards = list(layout.shards)
    if shards and rng.random() < 0.3:
        for s in rng.sample(shards, min(len(shards), 2)):
            r = rng.randrange(world)
            if all(not (t.box == s.box and t.rank == r) for t in shards):
                shards.append(Shard(s.box, r))
    rng.shuffle(shards)
    return Layout(shape, shards)


@dataclass
class Case:
    """One reshard on the pool; ``inputs[r]`` are rank r's source shards."""

    name: str
    src: Layout
    dst: Layout
    full: torch.Tensor
    noncontig: bool = False
    max_buffer_bytes: int | None = None
    group_ranks: tuple[int, ...] | None = None  # run on a subgroup of these world ranks
    inputs: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r in self.src.ranks:
            self.inputs[r] = [self.full[b.slices()].clone() for b in self.src.boxes_of(r)]

    def rank_args(self, world_rank: int) -> dict[str, Any]:
        group_rank = world_rank
        if self.group_ranks is not None:
            if world_rank not in self.group_ranks:
                return {"skip": True, "group_ranks": self.group_ranks}
            # new_group orders its members by world rank, whatever order they were listed in.
            group_rank = sorted(self.group_ranks).index(world_rank)
        return {
            "skip": False,
            "src": self.src,
            "dst": self.dst,
            "inputs": self.inputs.get(group_rank, []),
            "noncontig": self.noncontig,
            "max_buffer_bytes": self.max_buffer_bytes,
            "group_ranks": self.group_ranks,
        }


def random_cases(seed: int, n: int, world: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        shape = random_shape(rng)
        dtype = DTYPES[i % len(DTYPES)]
        src_world = rng.randint(1, world)
        dst_world = rng.randint(1, world)
        src = random_layout(rng, shape, src_world)
        dst = random_layout(rng, shape, dst_world)
        budget = rng.choice([None, None, 16, 40, 100, 1000])
        cases.append(
            Case(
                f"random#{i} seed={seed} {shape} {dtype}",
                src,
                dst,
                random_tensor(shape, dtype, seed * 100003 + i),
                noncontig=rng.random() < 0.5,
                max_buffer_bytes=budget,
            )
        )
    return cases


# ---------------------------------------------------------------- rank side


_GROUPS: dict[tuple[int, ...], Any] = {}


def _group(ranks: tuple[int, ...] | None) -> Any:
    if ranks is None:
        return None
    if ranks not in _GROUPS:
        _GROUPS[ranks] = dist.new_group(list(ranks))  # every rank calls this, members or not
    return _GROUPS[ranks]


def noncontig(t: torch.Tensor, how: int) -> torch.Tensor:
    """The same values in a non-contiguous tensor (a strided slice or a transposed copy)."""
    if t.dim() == 0:
        return t.clone()
    if how % 2 == 0 or t.dim() == 1:
        buf = torch.zeros((*t.shape[:-1], t.shape[-1] * 2 + 1), dtype=t.dtype)
        view = buf[..., 1::2]
        view.copy_(t)
        return view
    return t.transpose(0, -1).contiguous().transpose(0, -1)


def run_cases(rank: int, world: int, cases: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Run each case on this rank; ("ok", outputs) or ("err", type, message) per case."""
    out: list[tuple[Any, ...]] = []
    for i, c in enumerate(cases):
        group = _group(c["group_ranks"])
        if c["skip"]:
            out.append(("skip",))
            continue
        inputs = [noncontig(t, i) if c["noncontig"] else t for t in c["inputs"]]
        try:
            res = reshard(inputs, c["src"], c["dst"], group, max_buffer_bytes=c["max_buffer_bytes"])
            out.append(("ok", [t.clone() for t in res]))
        except Exception as e:
            out.append(("err", type(e).__name__, str(e)))
    return out


def run_state_dict(
    rank: int,
    world: int,
    state: dict[str, list[torch.Tensor]],
    src: dict[str, Layout],
    dst: dict[str, Layout],
    budget: int | None,
) -> dict[str, list[torch.Tensor]]:
    return reshard_state_dict(state, src, dst, max_buffer_bytes=budget)


def run_single(
    rank: int,
    world: int,
    inputs: list[torch.Tensor],
    src: Layout,
    dst: Layout,
    kwargs: dict[str, Any],
) -> list[torch.Tensor]:
    return reshard(inputs, src, dst, **kwargs)


def count_all_to_all(
    rank: int,
    world: int,
    inputs: list[torch.Tensor],
    src: Layout,
    dst: Layout,
    budget: int | None,
    transport: str = "all_to_all",
) -> tuple[int, int, list[torch.Tensor], int]:
    """Run a reshard while counting its rounds (all_to_all_single calls, or rounds of
    messages), the largest send or receive buffer (bytes) any of them used on this rank, and
    the bytes this rank sent in all."""
    if transport == "messages":
        return _count_messages(inputs, src, dst, budget)
    calls = [0, 0, 0]
    real = dist.all_to_all_single

    def counting(output: torch.Tensor, input: torch.Tensor, *a: Any, **k: Any) -> Any:
        calls[0] += 1
        # What this rank sends itself (its local pieces, when it receives in place) never
        # leaves it: count only what crosses to other ranks.
        splits = k.get("input_split_sizes")
        own = splits[dist.get_rank(k.get("group"))] if splits else 0
        calls[2] += input.numel() * input.element_size() - own
        calls[1] = max(
            calls[1], output.numel() * output.element_size(), input.numel() * input.element_size()
        )
        return real(output, input, *a, **k)

    dist.all_to_all_single = counting
    old, messages.TRANSPORT = messages.TRANSPORT, "all_to_all"
    try:
        res = reshard(inputs, src, dst, max_buffer_bytes=budget)
    finally:
        dist.all_to_all_single = real
        messages.TRANSPORT = old
    return calls[0], calls[1], res, calls[2]


def _count_messages(
    inputs: list[torch.Tensor], src: Layout, dst: Layout, budget: int | None
) -> tuple[int, int, list[torch.Tensor], int]:
    """count_all_to_all over messages: rounds, the largest buffer, and the bytes of every
    message this rank sent, read from what each round was given."""
    calls = [0, 0, 0]
    real = messages._message_round

    def counting(sent: Any, got: Any, send_buf: Any, recv_buf: Any, *a: Any, **k: Any) -> Any:
        calls[0] += 1
        calls[2] += sum(m.hi - m.lo for m, _ in sent)
        calls[1] = max(calls[1], send_buf.numel(), recv_buf.numel())
        return real(sent, got, send_buf, recv_buf, *a, **k)

    messages._message_round = counting  # type: ignore[assignment]
    old, messages.TRANSPORT = messages.TRANSPORT, "messages"
    try:
        res = reshard(inputs, src, dst, max_buffer_bytes=budget)
    finally:
        messages._message_round = real  # type: ignore[assignment]
        messages.TRANSPORT = old
    return calls[0], calls[1], res, calls[2]
