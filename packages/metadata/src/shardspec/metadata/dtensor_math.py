"""The box arithmetic behind DTensor layouts (spec/02-dtensor.md), on plain integers.

torch's placement objects are translated to :class:`Split` (``Shard(d)`` is
``Split(d, 1)``, ``_StridedShard(d, split_factor=f)`` is ``Split(d, f)``) and ``Replicate()``
to ``None`` by :mod:`shardspec.metadata.dtensor`; everything here is torch-free.

The model: along each tensor dim, a rank's local tensor holds a strictly increasing list of
global indices, its *piece*. A piece is stored as maximal runs of consecutive indices plus its
``end`` (one past its last index, or, for an empty piece, the offset where it sits). The mesh
dims that shard a tensor dim cut the previous piece left to right; the local tensor is the
global tensor indexed by the pieces of all dims (an outer product), so its boxes are the
products of the runs.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .box import Box
from .chunk import chunk_bounds
from .columns import COLUMNS_FROM, INT_LIMIT, ArrayRows, array_columns
from .errors import ConversionError
from .layout import Layout, Shard

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "DimRuns",
    "Split",
    "dim_pieces",
    "local_boxes",
    "local_pieces",
    "local_slices",
    "mesh_layout",
    "solve_splits",
    "split_piece",
]

_Run = tuple[int, int]  # [start, stop), global indices, never empty


@dataclass(frozen=True, slots=True)
class Split:
    """A mesh dim that shards tensor dim ``dim``: ``Shard(dim)`` when ``split_factor`` is 1,
    ``_StridedShard(dim, split_factor=split_factor)`` otherwise."""

    dim: int
    split_factor: int = 1


@dataclass(frozen=True, slots=True)
class DimRuns:
    """The global indices a rank holds along one tensor dim: maximal runs, ascending, and the
    piece's end (stop of the last run; for an empty piece, its offset)."""

    runs: tuple[_Run, ...]
    end: int

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.runs)

    def intervals(self) -> tuple[_Run, ...]:
        """The runs, or the one empty interval ``[end, end)`` for an empty piece."""
        return self.runs if self.runs else ((self.end, self.end),)

    def indices(self) -> list[int]:
        """The global indices, ascending (the order of the local tensor along this dim)."""
        return [i for a, b in self.runs for i in range(a, b)]

    def describe(self) -> str:
        if not self.runs:
            return f"empty at {self.end}"
        return " + ".join(f"[{a}, {b})" for a, b in self.runs)


def full_piece(n: int) -> DimRuns:
    return DimRuns(((0, n),) if n else (), n)


def _positions_to_piece(parent: DimRuns, spans: list[tuple[int, int]]) -> DimRuns:
    """The piece made of the parent's elements at local positions ``spans`` (ascending,
    disjoint); an empty result sits at the parent's end (CHUNK-2 in the parent's frame)."""
    starts: list[int] = []  # local position where each run of the parent starts
    acc = 0
    for a, b in parent.runs:
        starts.append(acc)
        acc += b - a
    out: list[_Run] = []
    for lo, hi in spans:
        while lo < hi:
            i = bisect_right(starts, lo) - 1
            run_a, run_b = parent.runs[i]
            g_lo = run_a + (lo - starts[i])
            take = min(hi - lo, run_b - g_lo)
            g_hi = g_lo + take
            if out and out[-1][1] == g_lo:
                out[-1] = (out[-1][0], g_hi)
            else:
                out.append((g_lo, g_hi))
            lo += take
    if not out:
        return DimRuns((), parent.end)
    return DimRuns(tuple(out), out[-1][1])


def split_spans(m: int, k: int, split_factor: int) -> list[list[tuple[int, int]]]:
    """For each of the ``k`` coordinates, the local positions (spans of ``[0, m)``) it takes.

    ``split_factor`` 1 is ``torch.chunk`` (CHUNK-1). Otherwise ``_StridedShard``: chunk
    ``[0, m)`` into ``split_factor`` pieces, chunk each of those into ``k``, and give
    coordinate ``i`` the ``i``-th chunk of every piece, in piece order.
    """
    if split_factor == 1:
        return [[(a, b)] if b > a else [] for a, b in chunk_bounds(m, k)]
    out: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    if m == 0:
        return out
    # Pieces past ceil(m / s1) are empty (torch.chunk returns fewer pieces), so a huge
    # split factor costs nothing.
    s1 = -(-m // split_factor)
    for j in range(-(-m // s1)):
        a, b = j * s1, min((j + 1) * s1, m)
        for i, (c, d) in enumerate(chunk_bounds(b - a, k)):
            if d > c:
                out[i].append((a + c, a + d))
    return out


def split_piece(parent: DimRuns, k: int, split_factor: int) -> list[DimRuns]:
    """The ``k`` child pieces a mesh dim of size ``k`` cuts from ``parent``."""
    return [_positions_to_piece(parent, s) for s in split_spans(parent.size, k, split_factor)]


def _check(shape: Sequence[int], mesh_shape: Sequence[int], splits: Sequence[Split | None]) -> None:
    if len(splits) != len(mesh_shape):
        raise ConversionError(
            f"{len(splits)} placements for a {len(mesh_shape)}-D mesh of shape "
            f"{tuple(mesh_shape)}: DTensor needs one placement per mesh dim"
        )
    for m, s in enumerate(splits):
        if s is None:
            continue
        if not 0 <= s.dim < len(shape):
            raise ConversionError(
                f"placement on mesh dim {m} shards dim {s.dim}, which a tensor of shape "
                f"{tuple(shape)} (ndim {len(shape)}) does not have"
            )
        if s.split_factor < 1:
            raise ConversionError(
                f"placement on mesh dim {m} has split_factor {s.split_factor}; it must be >= 1"
            )


def dim_pieces(
    n: int, mesh_shape: Sequence[int], splits: Sequence[Split | None], dim: int
) -> tuple[list[int], dict[tuple[int, ...], DimRuns]]:
    """The mesh dims that shard tensor dim ``dim`` (in order) and, for every combination of
    coordinates on them, the piece of ``dim`` those coordinates hold."""
    mesh_dims = [m for m, s in enumerate(splits) if s is not None and s.dim == dim]
    level: dict[tuple[int, ...], DimRuns] = {(): full_piece(n)}
    for m in mesh_dims:
        split = splits[m]
        assert split is not None
        nxt: dict[tuple[int, ...], DimRuns] = {}
        for prefix, parent in level.items():
            for i, child in enumerate(split_piece(parent, mesh_shape[m], split.split_factor)):
                nxt[prefix + (i,)] = child
        level = nxt
    return mesh_dims, level


def _grid(pieces: Sequence[DimRuns]) -> tuple[Box, ...]:
    per_dim = [p.intervals() for p in pieces]
    return tuple(
        Box._trusted(tuple(a for a, _ in cell), tuple(b - a for a, b in cell))
        for cell in itertools.product(*per_dim)
    )


def local_pieces(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    splits: Sequence[Split | None],
    coordinate: Sequence[int],
) -> tuple[DimRuns, ...]:
    """For each tensor dim, the piece the local tensor at ``coordinate`` holds (DTENSOR-5/6):
    its local shape is the pieces' sizes, its elements ``global[ix_(*indices)]``."""
    _check(shape, mesh_shape, splits)
    if len(coordinate) != len(mesh_shape) or not all(
        0 <= c < k for c, k in zip(coordinate, mesh_shape)
    ):
        raise ConversionError(
            f"coordinate {tuple(coordinate)} is not in a mesh of shape {tuple(mesh_shape)}"
        )
    pieces = []
    for d, n in enumerate(shape):
        mesh_dims, table = dim_pieces(n, mesh_shape, splits, d)
        pieces.append(table[tuple(coordinate[m] for m in mesh_dims)])
    return tuple(pieces)


def local_boxes(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    splits: Sequence[Split | None],
    coordinate: Sequence[int],
) -> tuple[Box, ...]:
    """The boxes of the local tensor at ``coordinate``, in local storage order (DTENSOR-7)."""
    return _grid(local_pieces(shape, mesh_shape, splits, coordinate))


def mesh_layout(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    ranks: Sequence[int],
    splits: Sequence[Split | None],
) -> Layout:
    """Every mesh coordinate's boxes (row-major over the mesh), owned by its rank."""
    _check(shape, mesh_shape, splits)
    if len(ranks) >= COLUMNS_FROM:
        built = _mesh_columns(tuple(shape), tuple(mesh_shape), ranks, splits)
        if built is not None:
            return built
    return _mesh_boxes(shape, mesh_shape, ranks, splits)


def _mesh_boxes(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    ranks: Sequence[int],
    splits: Sequence[Split | None],
) -> Layout:
    """:func:`mesh_layout` box by box: the reference the column build is checked against."""
    tables = [dim_pieces(n, mesh_shape, splits, d) for d, n in enumerate(shape)]
    shards: list[Shard] = []
    for flat, coord in enumerate(itertools.product(*(range(k) for k in mesh_shape))):
        pieces = [table[tuple(coord[m] for m in mesh_dims)] for mesh_dims, table in tables]
        shards.extend(Shard(b, ranks[flat]) for b in _grid(pieces))
    return Layout(shape, shards)


def _mesh_columns(
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    ranks: Sequence[int],
    splits: Sequence[Split | None],
) -> Layout | None:
    """:func:`mesh_layout` as int64 columns, one NumPy pass per tensor dim, when every
    coordinate holds one box; None otherwise (a ``_StridedShard`` piece of several runs, a value
    past int64, ranks that are not one plain int per coordinate), and the box build runs.

    Why: a job of W ranks builds each DTensor's layout of W boxes on every rank, and box by
    box that is 10 ms at W = 1024 (spec/09-checkpoint.md, "Measured"); as columns it is a few
    NumPy calls, and the layout makes Shard objects only for the ranks asked about."""
    import numpy as np

    w = math.prod(mesh_shape)
    if len(ranks) != w or any(n > INT_LIMIT for n in shape):
        return None
    if set(map(type, ranks)) != {int}:
        return None
    coords = np.indices(mesh_shape, dtype=np.int64).reshape(len(mesh_shape), w)
    offs = np.zeros((w, len(shape)), dtype=np.int64)
    sizes = np.empty((w, len(shape)), dtype=np.int64)
    for d, n in enumerate(shape):
        mesh_dims = [m for m, s in enumerate(splits) if s is not None and s.dim == d]
        table = _dim_columns(n, mesh_shape, splits, d, mesh_dims)
        if table is None:
            return None
        t_off, t_size = table
        if mesh_dims:
            at = np.ravel_multi_index(
                tuple(coords[m] for m in mesh_dims), tuple(mesh_shape[m] for m in mesh_dims)
            )
            offs[:, d], sizes[:, d] = t_off[at], t_size[at]
        else:
            sizes[:, d] = n
    try:
        rks = np.fromiter(ranks, dtype=np.int64, count=w)
    except OverflowError:
        return None
    columns = array_columns(offs, sizes, rks, shape)
    if columns is None:
        return None
    return Layout._from_plain(shape, ArrayRows(offs), ArrayRows(sizes), columns)


def _dim_columns(
    n: int,
    mesh_shape: tuple[int, ...],
    splits: Sequence[Split | None],
    dim: int,
    mesh_dims: list[int],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """:func:`dim_pieces` of one tensor dim as (offset, size) arrays in the same row-major
    order over ``mesh_dims``; None when a piece has several runs (no one box per coordinate)."""
    import numpy as np

    if any(s is not None and s.split_factor != 1 for s in (splits[m] for m in mesh_dims)):
        # _StridedShard: its table has one piece per combination of the mesh dims that cut this
        # tensor dim (a TP or FSDP degree, not W); one box each only if every piece is one run
        _, table = dim_pieces(n, mesh_shape, splits, dim)
        if any(len(p.runs) > 1 for p in table.values()):
            return None
        pieces = list(table.values())
        return (
            np.array([p.runs[0][0] if p.runs else p.end for p in pieces], dtype=np.int64),
            np.array([p.size for p in pieces], dtype=np.int64),
        )
    off = np.zeros(1, dtype=np.int64)
    size = np.full(1, n, dtype=np.int64)
    for m in mesh_dims:
        # torch.chunk of each parent piece into k (CHUNK-1); an empty child sits at its
        # parent's end (CHUNK-2 in the parent's frame), as _positions_to_piece puts it
        i = np.arange(mesh_shape[m], dtype=np.int64)[None, :]
        step = -(-size // mesh_shape[m])[:, None]
        lo = np.minimum(i * step, size[:, None])
        hi = np.minimum((i + 1) * step, size[:, None])
        off = np.where(hi > lo, off[:, None] + lo, (off + size)[:, None]).ravel()
        size = (hi - lo).ravel()
    return off, size


def local_slices(boxes: Sequence[Box]) -> list[tuple[slice, ...]]:
    """Where each of a rank's boxes sits in its DTensor local tensor (DTENSOR-7).

    In every dim the local tensor holds the rank's indices in ascending order, so a box starts
    at the number of the rank's indices (in that dim) that lie below it.
    """
    if not boxes:
        return []
    nd = boxes[0].ndim
    runs = [sorted({(b.offsets[d], b.sizes[d]) for b in boxes}) for d in range(nd)]
    out = []
    for b in boxes:
        sl = []
        for d in range(nd):
            before = sum(s for o, s in runs[d] if o < b.offsets[d])
            sl.append(slice(before, before + b.sizes[d]))
        out.append(tuple(sl))
    return out


# ---------------------------------------------------------------------------------------------
# From a layout back to placements


def _rank_pieces(layout: Layout, rank: int) -> list[DimRuns]:
    """Read a rank's per-dim pieces from its boxes, refusing anything that is not the block
    grid DTensor stores (DTENSOR-7)."""
    boxes = layout.boxes_of(rank)
    nd = layout.ndim
    per_dim: list[list[_Run]] = []
    for d in range(nd):
        seen: list[_Run] = []
        for b in boxes:
            iv = (b.offsets[d], b.offsets[d] + b.sizes[d])
            if iv not in seen:
                seen.append(iv)
        per_dim.append(seen)
    grid = _grid_from(per_dim)
    if tuple(grid) != boxes:
        raise ConversionError(
            f"rank {rank} holds boxes {list(boxes)}, which are not a DTensor local tensor: its "
            f"boxes must be every combination of its per-dim intervals {per_dim}, in row-major "
            f"order (DTENSOR-7)"
        )
    pieces = []
    for d, ivs in enumerate(per_dim):
        if len(ivs) == 1 and ivs[0][0] == ivs[0][1]:
            pieces.append(DimRuns((), ivs[0][0]))
            continue
        for i, (lo, hi) in enumerate(ivs):
            if hi == lo or (i and lo <= ivs[i - 1][1]):
                raise ConversionError(
                    f"rank {rank} holds intervals {ivs} in dim {d}: a DTensor local tensor "
                    f"holds ascending, non-adjacent, non-empty runs there (adjacent runs are "
                    f"one block) (DTENSOR-7)"
                )
        pieces.append(DimRuns(tuple(ivs), ivs[-1][1]))
    return pieces


def _grid_from(per_dim: list[list[_Run]]) -> list[Box]:
    return [
        Box(tuple(a for a, _ in cell), tuple(b - a for a, b in cell))
        for cell in itertools.product(*per_dim)
    ]


def _union(children: Sequence[DimRuns]) -> DimRuns | None:
    runs = sorted(r for c in children for r in c.runs)
    merged: list[_Run] = []
    for a, b in runs:
        if merged and a < merged[-1][1]:
            return None  # overlap
        if merged and a == merged[-1][1]:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    if merged:
        return DimRuns(tuple(merged), merged[-1][1])
    ends = {c.end for c in children}
    return DimRuns((), ends.pop()) if len(ends) == 1 else None


_Interval = tuple[int, float]  # split factors [lo, hi], hi may be inf


def _factor_candidates(parent: DimRuns, children: list[DimRuns]) -> list[_Interval]:
    """The split factors (as intervals) that cut ``parent`` into exactly ``children``.

    The cut depends on the split factor f only through s = ceil(m / f), the size of its first
    chunking; when s >= 2 and there are k >= 2 children, child 0's runs (in the parent's local
    positions) start at 0, s, 2s, ... with gaps between them, so its second run gives s. One
    run means s = m (plain chunking) or s = 1 (child 0 takes everything).
    """
    m, k = parent.size, len(children)
    if m == 0:
        return [(1, math.inf)] if all(c == parent for c in children) else []
    spans = _local_spans(parent, children[0])
    if spans is None:
        return []
    guesses = [spans[1][0]] if len(spans) >= 2 else sorted({m, 1})
    out: list[_Interval] = []
    for s in guesses:
        if not 1 <= s <= m:
            continue
        lo = -(-m // s)
        hi: float = math.inf if s == 1 else -(-m // (s - 1)) - 1
        if lo <= hi and split_piece(parent, k, lo) == children:
            out.append((lo, hi))
    return out


def _local_spans(parent: DimRuns, child: DimRuns) -> list[tuple[int, int]] | None:
    """``child``'s elements as spans of local positions in ``parent`` (None if not inside)."""
    firsts = [a for a, _ in parent.runs]
    local: list[int] = []  # local position of each parent run's first element
    acc = 0
    for a, b in parent.runs:
        local.append(acc)
        acc += b - a
    spans: list[tuple[int, int]] = []
    for a, b in child.runs:
        while a < b:
            i = bisect_right(firsts, a) - 1
            if i < 0 or a >= parent.runs[i][1]:
                return None
            ra, rb = parent.runs[i]
            take = min(b, rb) - a
            lo = local[i] + (a - ra)
            if spans and spans[-1][1] == lo:
                spans[-1] = (spans[-1][0], lo + take)
            else:
                spans.append((lo, lo + take))
            a += take
    return spans


def _intersect(a: list[_Interval], b: list[_Interval]) -> list[_Interval]:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return sorted(out)


def solve_splits(
    layout: Layout, mesh_shape: Sequence[int], ranks: Sequence[int]
) -> tuple[Split | None, ...]:
    """Placements (as splits) on this mesh that give exactly ``layout``, or ConversionError.

    Per mesh dim: the tensor dim it changes (none: Replicate; two: impossible). Per tensor
    dim: the pieces of every level of nesting are unions of the final pieces, and each level's
    split factor is read from how it cuts its parents (:func:`_factor_candidates`).
    """
    shape = layout.shape
    nd = len(shape)
    mesh_ndim = len(mesh_shape)
    coords = list(itertools.product(*(range(k) for k in mesh_shape)))
    mesh_ranks = set(ranks)
    extra = sorted(set(layout.ranks) - mesh_ranks)
    if extra:
        raise ConversionError(
            f"the layout has shards on ranks {extra}, which are not in the mesh "
            f"(mesh ranks {sorted(mesh_ranks)})"
        )
    missing = sorted(mesh_ranks - set(layout.ranks))
    if missing:
        raise ConversionError(
            f"mesh ranks {missing} hold no shard in the layout; every rank of a DTensor's mesh "
            f"holds a local tensor (an empty one is an empty box)"
        )
    pieces = {c: _rank_pieces(layout, ranks[i]) for i, c in enumerate(coords)}

    owner: list[int | None] = []  # tensor dim each mesh dim shards
    for m in range(mesh_ndim):
        changed: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for c in coords:
            if c[m] + 1 < mesh_shape[m]:
                nxt = (*c[:m], c[m] + 1, *c[m + 1 :])
                for d in range(nd):
                    if pieces[c][d] != pieces[nxt][d] and d not in changed:
                        changed[d] = (c, nxt)
        if len(changed) > 1:
            (d1, (a1, b1)), (d2, (a2, b2)) = list(changed.items())[:2]
            raise ConversionError(
                f"along mesh dim {m} the boxes change in dim {d1} (rank "
                f"{ranks[coords.index(a1)]} vs {ranks[coords.index(b1)]}) and in dim {d2} "
                f"(rank {ranks[coords.index(a2)]} vs {ranks[coords.index(b2)]}); one placement "
                f"shards one tensor dim"
            )
        owner.append(next(iter(changed), None))

    splits: list[Split | None] = [None] * mesh_ndim
    for d in range(nd):
        mesh_dims = [m for m in range(mesh_ndim) if owner[m] == d]
        if not mesh_dims:
            if any(p[d] != full_piece(shape[d]) for p in pieces.values()):
                raise ConversionError(
                    f"dim {d} is not sharded by any mesh dim, yet the boxes do not span "
                    f"[0, {shape[d]}) there"
                )
            continue
        levels: list[dict[tuple[int, ...], DimRuns]] = [{}]
        for c in coords:
            levels[0][tuple(c[m] for m in mesh_dims)] = pieces[c][d]
        for j in range(len(mesh_dims) - 1, -1, -1):
            parents: dict[tuple[int, ...], DimRuns] = {}
            for key in {k[:j] for k in levels[0]}:
                kids = [levels[0][key + (i,)] for i in range(mesh_shape[mesh_dims[j]])]
                union = _union(kids)
                if union is None:
                    raise ConversionError(
                        f"mesh dim {mesh_dims[j]} splits dim {d} into pieces "
                        f"{[p.describe() for p in kids]} that overlap or are empty at "
                        f"different offsets; DTensor cuts a piece into disjoint parts"
                    )
                parents[key] = union
            levels.insert(0, parents)
        top = levels[0][()]
        if top != full_piece(shape[d]):
            raise ConversionError(
                f"the pieces of dim {d} make up {top.describe()}, not the whole dim [0, {shape[d]})"
            )
        for j, m in enumerate(mesh_dims):
            factors: list[_Interval] = [(1, math.inf)]
            for key, parent in levels[j].items():
                kids = [levels[j + 1][key + (i,)] for i in range(mesh_shape[m])]
                cands = _factor_candidates(parent, kids)
                factors = _intersect(factors, cands)
                if not factors:
                    raise ConversionError(
                        f"no Shard({d}) or _StridedShard({d}, split_factor=f) on mesh dim {m} "
                        f"cuts {parent.describe()} into {[p.describe() for p in kids]} "
                        f"(coordinates 0..{mesh_shape[m] - 1} along mesh dim {m}); DTensor "
                        f"gives coordinate i the i-th chunk, so an uneven split that is not "
                        f"the chunk rule, or ranks in another order, cannot be expressed"
                    )
            splits[m] = Split(d, int(factors[0][0]))
    result = tuple(splits)
    again = mesh_layout(shape, mesh_shape, ranks, result)
    if again != layout or any(again.boxes_of(r) != layout.boxes_of(r) for r in ranks):
        raise ConversionError(  # pragma: no cover - the steps above are meant to be exact
            f"internal: placements {result} do not reproduce the layout"
        )
    return result
