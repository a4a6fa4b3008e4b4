"""A strict LocalShardsWrapper: the local shards of one table on one rank, with their offsets.

What it fixes relative to ``torch.distributed.tensor._shards_wrapper.LocalShardsWrapper``
(spec/08-torchrec.md, TORCHREC-11..14):

- its shape is the concatenation of the shards along the dim in which they are stacked (rows
  for a row-wise stack, columns for a column-wise one), not always along dim 1;
- shards and offsets must agree in count and ndim, shards in dtype and device, boxes may not
  overlap and, with a global shape, must lie inside it: a :class:`LayoutError` names the shard;
- it speaks DCP's protocol (``__create_write_items__``, ``__create_chunk_list__``,
  ``__get_tensor_shard__``) for the non-empty shards, so DCP can save and load it bare or
  inside a DTensor;
- it runs the ops a checkpoint or an optimizer applies to a parameter (detach, clone, to,
  copy_, zero_, fill_, the ``*_like`` and ``new_*`` factories, ``equal``, and every pointwise
  op) shard by shard, and refuses the rest by name instead of computing a wrong answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.utils._pytree import tree_map

from shardspec.metadata import Box, ConversionError, LayoutError
from shardspec.metadata.box import as_index_tuple

__all__ = ["SUPPORTED_OPS", "LocalShardsWrapper", "stacked_shape"]

aten = torch.ops.aten


def stacked_shape(boxes: Sequence[Box], ndim: int = 2) -> tuple[tuple[int, ...], int]:
    """``(shape, stack dim)`` of a rank's local shards laid end to end (TORCHREC-11).

    No shard: all zeros (``ndim`` dims). One shard: its shape. Several: they are stacked along
    the first dim in which their offsets differ (else the first in which their sizes differ,
    else dim 0) and must agree in every other dim; the shape is their sizes summed along the
    stack dim.
    """
    if not boxes:
        return (0,) * ndim, 0
    first = boxes[0]
    if len(boxes) == 1:
        return first.sizes, 0
    stack = next(
        (d for d in range(first.ndim) if any(b.offsets[d] != first.offsets[d] for b in boxes)),
        None,
    )
    if stack is None:
        # Same offsets (empty shards at one place): stack where the sizes differ.
        stack = next(
            (d for d in range(first.ndim) if any(b.sizes[d] != first.sizes[d] for b in boxes)),
            0,
        )
    for i, b in enumerate(boxes):
        for d in range(first.ndim):
            if d != stack and b.sizes[d] != first.sizes[d]:
                raise LayoutError(
                    f"local shard #{i} {b} cannot be stacked with shard #0 {first} along dim "
                    f"{stack}: its size in dim {d} is {b.sizes[d]}, not {first.sizes[d]}",
                    shards=(0, i),
                )
    sizes = list(first.sizes)
    sizes[stack] = sum(b.sizes[stack] for b in boxes)
    return tuple(sizes), stack


def _check_boxes(boxes: Sequence[Box], global_shape: tuple[int, ...] | None) -> None:
    for i, b in enumerate(boxes):
        if global_shape is not None and not b.fits_in(global_shape):
            raise LayoutError(
                f"local shard #{i} {b} does not lie inside the global shape {global_shape}",
                kind="bounds",
                shards=(i,),
            )
        for j in range(i):
            common = boxes[j].intersect(b)
            if common is not None:
                raise LayoutError(
                    f"local shards #{j} {boxes[j]} and #{i} {b} overlap in {common}",
                    kind="overlap",
                    shards=(j, i),
                )


class LocalShardsWrapper(torch.Tensor):
    """The local shards of one sharded tensor on this rank, each with its global offset.

    ``LocalShardsWrapper(shards, offsets, global_shape=None)``. ``global_shape`` is checked
    against when given and is needed to save the wrapper with DCP on its own (inside a DTensor
    the DTensor's shape is used). A rank with no shards passes ``[]`` twice and the table's
    ``ndim`` (or ``global_shape``).
    """

    _local_shards: list[torch.Tensor]
    _boxes: tuple[Box, ...]
    _global_shape: tuple[int, ...] | None
    _stack_dim: int
    __slots__ = ("_boxes", "_global_shape", "_local_shards", "_stack_dim")

    @staticmethod
    def __new__(
        cls,
        local_shards: Sequence[torch.Tensor],
        local_offsets: Sequence[Sequence[int]],
        *,
        global_shape: Sequence[int] | None = None,
        ndim: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> LocalShardsWrapper:
        shards = list(local_shards)
        offsets = list(local_offsets)
        if len(shards) != len(offsets):
            raise LayoutError(
                f"{len(shards)} local shards but {len(offsets)} offsets; give one offset per "
                f"shard (offsets {[tuple(o) for o in offsets]})"
            )
        gshape = None if global_shape is None else as_index_tuple(global_shape, "global_shape")
        boxes: list[Box] = []
        for i, (t, off) in enumerate(zip(shards, offsets)):
            if not isinstance(t, torch.Tensor) or isinstance(t, LocalShardsWrapper):
                raise LayoutError(f"local shard #{i} must be a plain tensor, got {type(t)}")
            o = as_index_tuple(off, f"offsets of local shard #{i}")
            if len(o) != t.ndim:
                raise LayoutError(
                    f"local shard #{i} has {t.ndim} dims (shape {tuple(t.shape)}) but its "
                    f"offsets {o} have {len(o)}",
                    kind="ndim",
                    shards=(i,),
                )
            if t.dtype != shards[0].dtype or t.device != shards[0].device:
                raise LayoutError(
                    f"local shard #{i} is {t.dtype} on {t.device} but shard #0 is "
                    f"{shards[0].dtype} on {shards[0].device}; one tensor has one dtype",
                    shards=(0, i),
                )
            boxes.append(Box(o, tuple(t.shape)))
        nd = shards[0].ndim if shards else (len(gshape) if gshape is not None else (ndim or 2))
        if ndim is not None and ndim != nd:
            raise LayoutError(f"ndim {ndim} but the shards have {nd} dims")
        if gshape is not None and len(gshape) != nd:
            raise LayoutError(f"global shape {gshape} has {len(gshape)} dims, the shards {nd}")
        for i, b in enumerate(boxes):
            if b.ndim != nd:
                raise LayoutError(
                    f"local shard #{i} has {b.ndim} dims, shard #0 has {nd}",
                    kind="ndim",
                    shards=(0, i),
                )
        _check_boxes(boxes, gshape)
        shape, stack = stacked_shape(boxes, nd)
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            shape,
            dtype=shards[0].dtype if shards else (dtype or torch.get_default_dtype()),
            device=shards[0].device if shards else torch.device(device or "cpu"),
            requires_grad=False,
        )
        r._local_shards = shards
        r._boxes = tuple(boxes)
        r._global_shape = gshape
        r._stack_dim = stack
        return r

    # ---- what it holds --------------------------------------------------------------------

    def local_shards(self) -> list[torch.Tensor]:
        return self._local_shards

    def local_offsets(self) -> list[torch.Size]:
        return [torch.Size(b.offsets) for b in self._boxes]

    def local_sizes(self) -> list[torch.Size]:
        return [torch.Size(b.sizes) for b in self._boxes]

    @property
    def local_boxes(self) -> tuple[Box, ...]:
        return self._boxes

    @property
    def global_shape(self) -> tuple[int, ...] | None:
        return self._global_shape

    @property
    def stack_dim(self) -> int:
        return self._stack_dim

    @property
    def local_chunks(self) -> list[ChunkStorageMetadata]:
        """DCP chunks of the non-empty shards (an empty shard holds nothing to save or load)."""
        return self._chunks(self._global_shape)

    def _chunks(self, size: Sequence[int] | None) -> list[ChunkStorageMetadata]:
        if size is not None and math.prod(size) == 0:
            # A tensor with no elements still needs one chunk, or DCP forgets its key; every
            # rank names the same whole-tensor chunk and DCP keeps one.
            return [ChunkStorageMetadata(torch.Size([0] * len(size)), torch.Size(size))]
        return [
            ChunkStorageMetadata(offsets=torch.Size(b.offsets), sizes=torch.Size(b.sizes))
            for b in self._boxes
            if not b.is_empty
        ]

    def is_empty_shard(self) -> bool:
        return all(b.is_empty for b in self._boxes)

    def storage_metadata(self) -> TensorStorageMetadata:
        size = self._global_shape if self._global_shape is not None else tuple(self.shape)
        return TensorStorageMetadata(
            properties=self._properties(), size=torch.Size(size), chunks=self.local_chunks
        )

    def with_shards(self, shards: Sequence[torch.Tensor]) -> LocalShardsWrapper:
        """A wrapper of ``shards`` at this wrapper's offsets (same global shape)."""
        return LocalShardsWrapper(
            shards,
            [b.offsets for b in self._boxes],
            global_shape=self._global_shape,
            ndim=self.ndim,
            dtype=self.dtype,
            device=self.device,
        )

    def _properties(self) -> TensorProperties:
        if self._local_shards:
            return TensorProperties.create_from_tensor(self._local_shards[0])
        return TensorProperties(dtype=self.dtype)

    def __repr__(self) -> str:  # type: ignore[override]
        return (
            f"LocalShardsWrapper(boxes={list(self._boxes)}, global_shape={self._global_shape}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    def __hash__(self) -> int:
        return id(self)

    # ---- DCP protocol ---------------------------------------------------------------------

    def __create_write_items__(self, fqn: str, object: Any) -> list[WriteItem]:
        if object is self or isinstance(object, LocalShardsWrapper):
            if self._global_shape is None:
                raise ConversionError(
                    f"{fqn}: a LocalShardsWrapper saved on its own needs its global_shape "
                    f"(give global_shape=..., or save the DTensor that holds it)"
                )
            size = torch.Size(self._global_shape)
        else:
            size = object.size()  # the DTensor's global shape
        props = self._properties()
        return [
            WriteItem(
                index=MetadataIndex(fqn, chunk.offsets, i),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=chunk, properties=props, size=size),
            )
            for i, chunk in enumerate(self._chunks(size))
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return self.local_chunks

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        gs = self._global_shape
        if gs is not None and math.prod(gs) == 0:
            return torch.empty(gs, dtype=self.dtype, device=self.device)
        full = [(t, b) for t, b in zip(self._local_shards, self._boxes) if not b.is_empty]
        if index.index is not None and index.index < len(full):
            t, b = full[index.index]
            if index.offset is None or tuple(index.offset) == b.offsets:
                return t
        if index.offset is not None:
            for t, b in full:
                if tuple(index.offset) == b.offsets:
                    return t
        raise ValueError(
            f"{index.fqn}: no local shard at offset {index.offset}; this rank holds "
            f"{[b.offsets for _, b in full]}"
        )

    def _get_tensor_size_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._local_shards)

    # ---- ops ------------------------------------------------------------------------------

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        special = _SPECIAL.get(func)
        if special is not None:
            return special(func, args, kwargs)
        if torch.Tag.pointwise in func.tags or func in _SHARDWISE:
            return _shardwise(func, args, kwargs)
        raise NotImplementedError(
            f"{func} is not supported on a LocalShardsWrapper: it is not elementwise, so running "
            f"it shard by shard could give a wrong answer. Supported: every pointwise op and "
            f"{sorted(str(f) for f in (*_SPECIAL, *_SHARDWISE))}"
        )


def _wrappers(args: Any, kwargs: Any) -> list[LocalShardsWrapper]:
    found: list[LocalShardsWrapper] = []

    def visit(x: Any) -> Any:
        if isinstance(x, LocalShardsWrapper):
            found.append(x)
        return x

    tree_map(visit, (args, kwargs))
    return found


def _shardwise(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run an elementwise op on each shard; every wrapper argument must hold the same boxes."""
    wrappers = _wrappers(args, kwargs)
    lead = wrappers[0]
    for w in wrappers[1:]:
        if w.local_boxes != lead.local_boxes:
            raise LayoutError(
                f"{func}: the LocalShardsWrapper operands hold different boxes "
                f"({list(lead.local_boxes)} vs {list(w.local_boxes)}); reshard one first"
            )

    def check_plain(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, LocalShardsWrapper) and x.ndim:
            raise NotImplementedError(
                f"{func}: a plain tensor of shape {tuple(x.shape)} cannot be combined with a "
                f"LocalShardsWrapper (only 0-d tensors broadcast to every shard)"
            )
        return x

    tree_map(check_plain, (args, kwargs))
    outs = []
    for i in range(len(lead.local_shards())):

        def pick(x: Any, i: int = i) -> Any:
            return x.local_shards()[i] if isinstance(x, LocalShardsWrapper) else x

        a, k = tree_map(pick, (args, kwargs))
        outs.append(func(*a, **k))
    if func._schema.is_mutable:
        # In-place (or out=) ops mutate the shards; their result is the mutated argument.
        return args[0]
    if outs and isinstance(outs[0], tuple):
        return tuple(lead.with_shards([o[j] for o in outs]) for j in range(len(outs[0])))
    if not outs:
        return _empty_like_result(func, lead, args, kwargs)
    if isinstance(outs[0], torch.Tensor):
        return lead.with_shards(outs)
    raise NotImplementedError(f"{func} returned {type(outs[0])} per shard")


def _empty_like_result(
    func: Any, lead: LocalShardsWrapper, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> LocalShardsWrapper:
    # A rank with no shards still needs the result's dtype (e.g. ``.to(torch.float16)``).
    a, k = tree_map(_meta_probe, (args, kwargs))
    probe = func(*a, **k)
    return LocalShardsWrapper(
        [],
        [],
        global_shape=lead.global_shape,
        ndim=lead.ndim,
        dtype=probe.dtype if isinstance(probe, torch.Tensor) else lead.dtype,
        device=lead.device,
    )


def _meta_probe(x: Any) -> Any:
    if isinstance(x, LocalShardsWrapper):
        return torch.empty((0,) * x.ndim, dtype=x.dtype, device="meta")
    return x


def _copy_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dst, src = args[0], args[1]
    if not isinstance(dst, LocalShardsWrapper):
        raise NotImplementedError(
            "copying a LocalShardsWrapper into a plain tensor is ambiguous (which box goes "
            "where?); copy its local_shards() instead"
        )
    if isinstance(src, LocalShardsWrapper) and src.local_boxes != dst.local_boxes:
        raise LayoutError(
            f"copy_: source boxes {list(src.local_boxes)} differ from destination boxes "
            f"{list(dst.local_boxes)}; reshard the source first"
        )
    return _shardwise(func, args, kwargs)


def _equal(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    a, b = args[0], args[1]
    if not (isinstance(a, LocalShardsWrapper) and isinstance(b, LocalShardsWrapper)):
        return False
    if a.local_boxes != b.local_boxes or a.dtype != b.dtype:
        return False
    return all(bool(aten.equal.default(x, y)) for x, y in zip(a.local_shards(), b.local_shards()))


def _same_shape_only(kind: str) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """view / new_* with the wrapper's own shape: per shard with each shard's shape."""

    def handle(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        w: LocalShardsWrapper = args[0]
        size = list(args[1]) if len(args) > 1 else list(w.shape)
        if -1 in size and size.count(-1) == 1:
            known = math.prod(s for s in size if s != -1)
            size[size.index(-1)] = w.numel() // known if known else 0
        if tuple(size) != tuple(w.shape):
            raise NotImplementedError(
                f"{func} to shape {tuple(args[1])} on a LocalShardsWrapper of shape "
                f"{tuple(w.shape)}: only its own shape is supported (a {kind} of the stacked "
                f"shards would mix boxes)"
            )
        rest = args[2:]
        return w.with_shards([func(t, list(t.shape), *rest, **kwargs) for t in w.local_shards()])

    return handle


def _detach(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Upstream detaches in place and returns the same object; a detach is a new alias.
    w: LocalShardsWrapper = args[0]
    return w.with_shards([t.detach() for t in w.local_shards()])


def _refuse_collective(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise NotImplementedError(
        f"{func} on a LocalShardsWrapper: gathering its shards needs the table's layout "
        f"(the DTensor placements TorchRec writes do not describe it); use "
        f"shardspec.torchrec.gather_layout and shardspec.reshard instead"
    )


_SPECIAL: dict[Any, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {
    aten.copy_.default: _copy_,
    aten.equal.default: _equal,
    aten.detach.default: _detach,
    aten.view.default: _same_shape_only("view"),
    aten._unsafe_view.default: _same_shape_only("view"),
    aten.new_empty.default: _same_shape_only("new tensor"),
    aten.new_zeros.default: _same_shape_only("new tensor"),
    aten.new_ones.default: _same_shape_only("new tensor"),
    aten.new_full.default: _same_shape_only("new tensor"),
    torch.ops._c10d_functional.all_gather_into_tensor.default: _refuse_collective,
}

# Elementwise but not tagged pointwise: run shard by shard.
_SHARDWISE = frozenset(
    {
        aten.clone.default,
        aten.alias.default,
        aten._to_copy.default,
        aten.zero_.default,
        aten.fill_.Scalar,
        aten.fill_.Tensor,
        aten.empty_like.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.rand_like.default,
        aten.randn_like.default,
    }
)

SUPPORTED_OPS = frozenset({*_SPECIAL, *_SHARDWISE}) - {
    torch.ops._c10d_functional.all_gather_into_tensor.default
}
