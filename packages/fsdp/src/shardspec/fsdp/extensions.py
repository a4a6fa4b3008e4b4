"""A drop-in ``FSDPExtensions`` for FSDP1 + TP whose metadata comes from the layout rules.

torch's ``DTensorExtensions`` (tensor/parallel/fsdp.py) reports uneven TP shards at floor
offsets, names a scapegoat rank as the owner of every shard but its own, and builds the
``SHARDED_STATE_DICT`` DTensor by ``redistribute``-ing a DTensor whose placements misdescribe
the data, which aborts gloo for uneven TP shards. Here every local chunk is cut locally (no
collective) and every box and owner comes from :mod:`shardspec.fsdp.rules` (FSDP-6).

``install(model)`` puts an instance on every FSDP state and flat-parameter handle of a wrapped
model (torch >= 2.4 keeps one per state); ``install()`` makes it the default for models
wrapped afterwards (FSDP-7).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.fsdp
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharded_tensor.shard import Shard as STShard
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp._fsdp_extensions import FSDPExtensions
from torch.distributed.tensor import DTensor

from shardspec.metadata import Box, ConversionError, Layout, Shard, chunk_bounds, chunk_layout
from shardspec.metadata.dtensor_math import local_pieces
from shardspec.metadata.placements import (
    Placement,
    Replicate,
    ShardDim,
    StridedShardDim,
    from_torch,
    to_split,
    to_torch,
)
from shardspec.metadata.shard_metadata import to_sharded_tensor_metadata

from .rules import fsdp_box, mesh_coords, placements_layout, tp_box

__all__ = ["DTensorExtensions", "install", "mesh_fsdp_layout"]

# The attribute on an outer (TP) ShardedTensor that carries the 2-D layout with every owner's
# global rank; flatten_sharded_tensors reads it.
LAYOUT_ATTR = "_shardspec_layout"
# Held while a cached layout is built: ranks that are threads of one process (a simulated
# world) ask for the same layout at once; one builds it, the others then take it from the cache.
_CACHE_LOCK = threading.RLock()
# On a flat ShardedTensor that chunk_dtensor returns instead of a DTensor: the root mesh dim
# FSDP shards over, which all_gather_dtensor needs to reassemble the TP piece.
FSDP_DIM_ATTR = "_shardspec_fsdp_mesh_dim"


def _device_str(t: torch.Tensor) -> str:
    return str(t.device)


def _make_st(
    layout: Layout,
    my_rank: int,
    local: list[tuple[Box, torch.Tensor]],
    like: torch.Tensor,
    pg: Any,
) -> ShardedTensor:
    """A ShardedTensor whose global metadata is ``layout`` (owners are global ranks) and whose
    local shards are ``local`` (this rank's boxes with their data)."""
    device = _device_str(like)
    md = to_sharded_tensor_metadata(layout, like.dtype, device=device)
    shards = [
        STShard(
            tensor=t.contiguous(),
            metadata=ShardMetadata(
                shard_offsets=list(b.offsets),
                shard_sizes=list(b.sizes),
                placement=f"rank:{my_rank}/{device}",
            ),
        )
        for b, t in local
    ]
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, sharded_tensor_metadata=md, process_group=pg, init_rrefs=False
    )


def _mesh_index(root: DeviceMesh, sub: DeviceMesh) -> list[int]:
    """The dims of ``root`` that ``sub`` was sliced from (by name)."""
    names = root.mesh_dim_names
    sub_names = sub.mesh_dim_names
    if names is None or sub_names is None:
        raise ConversionError(
            f"cannot tell which dims of mesh {root} the submesh {sub} uses: name the mesh dims "
            "(init_device_mesh(..., mesh_dim_names=...))"
        )
    out = []
    for n in sub_names:
        if n not in names:
            raise ConversionError(f"mesh dim {n!r} of {sub} is not a dim of {root}")
        out.append(names.index(n))
    return out


def mesh_fsdp_layout(
    shape: Sequence[int],
    tp: Placement,
    mesh_shape: Sequence[int],
    ranks: Sequence[int],
    *,
    tp_dim: int | None,
    shard_dim: int,
    fsdp_tensor_dim: int = 0,
) -> Layout:
    """FSDP-1 on an arbitrary mesh: TP on mesh dim ``tp_dim`` (None: no TP), FSDP chunking
    over mesh dim ``shard_dim``, every other mesh dim replicating.

    Cached (the layout is immutable): a state dict's parameters share a few shapes, and every
    rank asks for the same layout, which costs O(ranks) to build."""
    with _CACHE_LOCK:
        return _mesh_fsdp_layout(
            tuple(shape), tp, tuple(mesh_shape), tuple(ranks), tp_dim, shard_dim, fsdp_tensor_dim
        )


@functools.lru_cache(maxsize=256)
def _mesh_fsdp_layout(
    shape: tuple[int, ...],
    tp: Placement,
    mesh_shape: tuple[int, ...],
    ranks: tuple[int, ...],
    tp_dim: int | None,
    shard_dim: int,
    fsdp_tensor_dim: int,
) -> Layout:
    tp_size = mesh_shape[tp_dim] if tp_dim is not None else 1
    tp_pl: Placement = tp if tp_dim is not None else Replicate()
    shards = []
    for rank, coord in zip(ranks, mesh_coords(mesh_shape)):
        t = coord[tp_dim] if tp_dim is not None else 0
        box = fsdp_box(
            shape,
            tp_pl,
            tp_size=tp_size,
            dp_size=mesh_shape[shard_dim],
            t=t,
            p=coord[shard_dim],
            shard_dim=fsdp_tensor_dim,
        )
        shards.append(Shard(box, rank))
    return Layout(tuple(shape), shards)


def _root_roles(
    tp_mesh: DeviceMesh | None, fsdp_ranks: Sequence[int]
) -> tuple[DeviceMesh, int | None, int] | None:
    """(root mesh, its TP dim, its FSDP shard dim) for a TP mesh and the ranks of FSDP's
    process group, or None when the root mesh does not contain both."""
    if tp_mesh is None:
        return None
    root = tp_mesh._get_root_mesh()
    if root is None or root.ndim < 2:
        return None
    try:
        (tp_dim,) = _mesh_index(root, tp_mesh)
    except (ConversionError, ValueError):
        return None
    coord = root.get_coordinate()
    if coord is None:
        return None
    grid = root.mesh
    want = set(fsdp_ranks)
    for d in range(root.ndim):
        if d == tp_dim:
            continue
        index: list[Any] = list(coord)
        index[d] = slice(None)
        if set(grid[tuple(index)].reshape(-1).tolist()) == want:
            return root, tp_dim, d
    return None


class DTensorExtensions(FSDPExtensions):
    """FSDP1 + TP state-dict hooks with exact boxes and owners (spec/07-fsdp.md, FSDP-6).

    Behaves like torch's ``DTensorExtensions`` for flattening and unflattening parameters
    (TP DTensors are flattened as their local tensors and rebuilt from their spec), and
    replaces the state-dict side:

    * ``chunk_tensor`` returns a ShardedTensor (nested for a TP DTensor: outer TP boxes over
      the TP group, inner FSDP chunks over FSDP's group) whose every shard sits at its
      chunk-rule offset, is owned by the rank that really holds it, and empty chunks sit at
      the spec's offset; nothing is communicated.
    * ``chunk_dtensor`` returns a DTensor on the root mesh whose local tensor is this rank's
      FSDP chunk of its TP piece, cut locally, with placements that describe exactly that
      (FSDP-5); where no DTensor placements can (7 rows on dp=3 x tp=2), it returns a flat
      ShardedTensor over the world with the true boxes instead, which DCP saves and
      ``all_gather_dtensor`` takes back. It raises ConversionError only for what it cannot
      shard at all: a mesh of fewer than 2 dims, a TP mesh of more than 1, a 0-d tensor.
    * ``all_gather_dtensor`` gathers only along the FSDP dim, with padding for uneven chunks.
    """

    def __init__(self, device_handle: Any = None) -> None:
        super().__init__()
        self.compute_stream: Any = None
        self.device_handle = device_handle

    # flattening ----------------------------------------------------------------------------

    def pre_flatten_transform(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any | None]:
        from torch.distributed.tensor.parallel._data_parallel_utils import _flatten_tensor

        return _flatten_tensor(tensor)

    def post_unflatten_transform(self, tensor: torch.Tensor, param_extension: Any) -> torch.Tensor:
        from torch.distributed.fsdp._common_utils import _set_fsdp_flattened
        from torch.distributed.tensor.parallel._data_parallel_utils import _unflatten_tensor

        # Views are rebuilt on the compute stream because forward/backward use them there;
        # CPU handles have no streams to switch.
        handle = self.device_handle
        stream = self.compute_stream
        if handle is not None and hasattr(handle, "stream") and hasattr(handle, "current_stream"):
            ctx: Any = handle.stream(stream or handle.current_stream())
        else:
            import contextlib

            ctx = contextlib.nullcontext()
        with ctx:
            result = _unflatten_tensor(
                tensor, param_extension, device_handle=handle, compute_stream=stream
            )
        _set_fsdp_flattened(result)
        return result  # type: ignore[no-any-return]

    # SHARDED_STATE_DICT with ShardedTensor ---------------------------------------------------

    def chunk_tensor(
        self,
        tensor: torch.Tensor,
        rank: int,
        world_size: int,
        num_devices_per_node: int,
        pg: dist.ProcessGroup,
        device: torch.device | None = None,
    ) -> torch.Tensor:
        fsdp_ranks = [dist.get_global_rank(pg, i) for i in range(world_size)]
        if type(tensor) is DTensor:
            return self._chunk_tp_dtensor(tensor, rank, fsdp_ranks, pg)
        if type(tensor) is ShardedTensor:
            return self._chunk_tp_sharded_tensor(tensor, rank, world_size, fsdp_ranks, pg)
        return _chunk_plain(tensor.detach(), rank, fsdp_ranks, pg)

    def _chunk_tp_dtensor(
        self, dt: DTensor, rank: int, fsdp_ranks: list[int], pg: Any
    ) -> ShardedTensor:
        tp_mesh = dt.device_mesh
        if tp_mesh.ndim != 1:
            raise ConversionError(
                f"chunk_tensor handles DTensors on a 1-D TP mesh; got mesh {tp_mesh} with "
                f"placements {dt.placements}"
            )
        tp = from_torch(dt.placements[0])
        shape = tuple(dt.shape)
        tp_ranks = [int(r) for r in tp_mesh.mesh.tolist()]
        t = tp_mesh.get_local_rank()
        me = dist.get_rank()
        local = dt.to_local().detach()
        inner = _chunk_plain(local, rank, fsdp_ranks, pg)
        if isinstance(tp, Replicate):
            # Every TP rank holds the whole tensor; the outer ShardedTensor (over the TP group)
            # can name one owner per box, and the one that holds it here is this rank.
            outer = Layout(shape, [Shard(Box.full(shape), me)])
        else:
            outer = Layout(
                shape,
                [Shard(tp_box(shape, tp, len(tp_ranks), i), r) for i, r in enumerate(tp_ranks)],
            )
        my_outer = tp_box(shape, tp, len(tp_ranks), t)
        st = _make_st(outer, me, [(my_outer, inner)], local, tp_mesh.get_group())
        st.metadata().tensor_properties.requires_grad = False
        roles = _root_roles(tp_mesh, fsdp_ranks)
        if roles is not None:
            root, tp_dim, shard_dim = roles
            layout = mesh_fsdp_layout(
                shape,
                tp,
                tuple(root.mesh.shape),
                root.mesh.reshape(-1).tolist(),
                tp_dim=tp_dim,
                shard_dim=shard_dim,
            )
            setattr(st, LAYOUT_ATTR, layout)
        return st

    def _chunk_tp_sharded_tensor(
        self, st: ShardedTensor, rank: int, world_size: int, fsdp_ranks: list[int], pg: Any
    ) -> ShardedTensor:
        # The older TP path hands FSDP a ShardedTensor with one local shard: chunk that shard's
        # tensor and keep the outer metadata, which already names real owners.
        shards = st.local_shards()
        if len(shards) != 1:
            raise ConversionError(
                f"chunk_tensor needs exactly one local shard on rank {dist.get_rank()}, "
                f"got {len(shards)}"
            )
        outer_shard = shards[0]
        inner = _chunk_plain(outer_shard.tensor.detach(), rank, fsdp_ranks, pg)
        import copy

        md = copy.deepcopy(st.metadata())
        md.tensor_properties.requires_grad = False
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            [STShard(inner, copy.deepcopy(outer_shard.metadata))],
            sharded_tensor_metadata=md,
            process_group=st._process_group,
            init_rrefs=False,
        )

    def pre_load_state_dict_transform(
        self, tensor: torch.Tensor
    ) -> tuple[torch.Tensor, list[STShard]]:
        if type(tensor) is not ShardedTensor:
            raise ConversionError(
                f"a SHARDED_STATE_DICT entry must be a ShardedTensor, got {type(tensor).__name__}"
            )
        shards = tensor.local_shards()
        if len(shards) == 1 and type(shards[0].tensor) is ShardedTensor:
            inner: ShardedTensor = shards[0].tensor
            return inner, list(inner.local_shards())
        return tensor, list(shards)

    # SHARDED_STATE_DICT with DTensor (FSDP given a device_mesh) ------------------------------

    def chunk_dtensor(
        self, tensor: torch.Tensor, rank: int, device_mesh: DeviceMesh
    ) -> torch.Tensor:
        root = device_mesh._get_root_mesh() if device_mesh is not None else None
        if root is None or root.ndim < 2:
            raise ConversionError(
                f"chunk_dtensor needs FSDP's device_mesh to be sliced from a mesh of 2 or more "
                f"dims (FSDP + TP); got {device_mesh}"
            )
        shard_dim = _mesh_index(root, device_mesh)[-1]
        shape = tuple(tensor.shape)
        if isinstance(tensor, DTensor):
            tp_mesh = tensor.device_mesh
            if tp_mesh.ndim != 1:
                raise ConversionError(f"chunk_dtensor handles a 1-D TP mesh; got {tp_mesh}")
            (tp_dim,) = _mesh_index(root, tp_mesh)
            tp = from_torch(tensor.placements[0])
            local = tensor.to_local().detach()
            tp_size = tp_mesh.size()
        else:
            tp_dim, tp, local, tp_size = None, Replicate(), tensor.detach(), 1
        if not shape:
            raise ConversionError(
                "chunk_dtensor cannot shard a 0-d tensor (torch.chunk needs a dim)"
            )
        mesh_shape = tuple(root.mesh.shape)
        with _CACHE_LOCK:
            placements = _exact_placements(shape, mesh_shape, tp, tp_dim, tp_size, shard_dim)
        coord = root.get_coordinate()
        assert coord is not None
        p = coord[shard_dim]
        lo, hi = chunk_bounds(local.shape[0], mesh_shape[shard_dim])[p]
        mine = local[lo:hi].clone().contiguous()
        if placements is None:
            # No DTensor can say where these rows are (FSDP-5): a flat ShardedTensor can.
            return self._flat_sharded_tensor(shape, tp, tp_dim, shard_dim, root, mine)
        contiguous_stride = _contiguous_stride(shape)
        return DTensor.from_local(
            mine,
            root,
            [to_torch(pl) for pl in placements],
            run_check=False,
            shape=torch.Size(shape),
            stride=contiguous_stride,
        )

    def _flat_sharded_tensor(
        self,
        shape: tuple[int, ...],
        tp: Placement,
        tp_dim: int | None,
        shard_dim: int,
        root: DeviceMesh,
        mine: torch.Tensor,
    ) -> ShardedTensor:
        ranks = [int(r) for r in root.mesh.reshape(-1).tolist()]
        layout = mesh_fsdp_layout(
            shape, tp, tuple(root.mesh.shape), ranks, tp_dim=tp_dim, shard_dim=shard_dim
        )
        me = dist.get_rank()
        group = {int(r) for r in _ranks_along(root, shard_dim)}
        (my_box,) = layout.boxes_of(me)
        st = _make_st(one_owner_per_box(layout, me, group), me, [(my_box, mine)], mine, None)
        setattr(st, FSDP_DIM_ATTR, shard_dim)
        return st

    def all_gather_dtensor(self, tensor: DTensor, parent_mesh: DeviceMesh | None) -> torch.Tensor:
        # chunk_dtensor returns a flat ShardedTensor where no DTensor is exact (FSDP-5).
        if isinstance(tensor, ShardedTensor):
            return gather_flat_sharded_tensor(tensor, parent_mesh)
        if parent_mesh is not None and parent_mesh != tensor.device_mesh:
            raise ConversionError(
                f"all_gather_dtensor expects a DTensor on FSDP's root mesh {parent_mesh}, got one "
                f"on {tensor.device_mesh}"
            )
        return gather_fsdp_dim(tensor)


def gather_flat_sharded_tensor(st: ShardedTensor, root: DeviceMesh | None) -> torch.Tensor:
    dim = getattr(st, FSDP_DIM_ATTR, None)
    if root is None or dim is None:
        raise ConversionError(
            "all_gather_dtensor got a ShardedTensor that shardspec.fsdp's chunk_dtensor did not "
            "build (it does not say which mesh dim FSDP shards); load into the state dict that "
            "model.state_dict() returned"
        )
    (shard,) = st.local_shards()
    local = shard.tensor
    group = root.get_group(dim)
    k = root.mesh.shape[dim]
    # FSDP's chunks of one TP piece are consecutive along dim 0 in group order: gather the
    # sizes, then the padded chunks, and concatenate the unpadded ones.
    # On the shard's device: an NCCL group takes CUDA tensors only.
    sizes = [torch.zeros(1, dtype=torch.int64, device=local.device) for _ in range(k)]
    mine = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    dist.all_gather(sizes, mine, group=group)
    rows = [int(x.item()) for x in sizes]
    width = max(rows)
    buf = local.new_zeros((width, *local.shape[1:]))
    buf[: local.shape[0]].copy_(local)
    outs = [torch.empty_like(buf) for _ in range(k)]
    dist.all_gather(outs, buf, group=group)
    return torch.cat([o[:n] for o, n in zip(outs, rows)], dim=0)


def one_owner_per_box(layout: Layout, me: int, group: set[int]) -> Layout:
    """The layout with one owner per distinct box (replicas from TP Replicate or HSDP):
    ``me`` if it holds the box, else a rank of ``group``, else the lowest; ShardedTensor
    metadata cannot state replicas."""

    def preference(rank: int) -> tuple[int, int]:
        return (0 if rank == me else 1 if rank in group else 2, rank)

    chosen: dict[Box, int] = {}
    for s in layout.shards:
        if s.box not in chosen or preference(s.rank) < preference(chosen[s.box]):
            chosen[s.box] = s.rank
    return Layout(layout.shape, [Shard(b, r) for b, r in chosen.items()])


def _ranks_along(root: DeviceMesh, dim: int) -> list[int]:
    coord = root.get_coordinate()
    assert coord is not None
    index: list[Any] = list(coord)
    index[dim] = slice(None)
    return [int(r) for r in root.mesh[tuple(index)].reshape(-1).tolist()]


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride = []
    acc = 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


@functools.lru_cache(maxsize=256)
def _exact_placements(
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    tp: Placement,
    tp_dim: int | None,
    tp_size: int,
    shard_dim: int,
) -> tuple[Placement, ...] | None:
    """Placements on the root mesh whose DTensor layout is FSDP-1's (FSDP-5), or None.
    Cached as :func:`mesh_fsdp_layout` is: it compares layouts of every rank."""
    truth = mesh_fsdp_layout(
        shape, tp, mesh_shape, range(math.prod(mesh_shape)), tp_dim=tp_dim, shard_dim=shard_dim
    )
    dp_options: list[Placement] = [ShardDim(0)]
    if isinstance(tp, ShardDim) and tp.dim == 0 and tp_size > 1:
        dp_options.insert(0, StridedShardDim(0, tp_size))
    for dp_pl in dp_options:
        pls: list[Placement] = [Replicate()] * len(mesh_shape)
        pls[shard_dim] = dp_pl
        if tp_dim is not None:
            pls[tp_dim] = tp
        got = placements_layout(shape, mesh_shape, pls)
        if got.equivalent(truth) and all(len(got.boxes_of(r)) == 1 for r in got.ranks):
            return tuple(pls)
    return None


def _chunk_plain(tensor: torch.Tensor, rank: int, fsdp_ranks: list[int], pg: Any) -> ShardedTensor:
    """FSDP's dim-0 chunk of a plain tensor as a ShardedTensor over FSDP's group: every chunk
    listed (empty ones at offset n, CHUNK-2), each owned by its real global rank."""
    if tensor.dim() == 0:
        raise ConversionError("FSDP cannot chunk a 0-d tensor (torch.chunk needs a dim)")
    with _CACHE_LOCK:
        layout = _chunk_layout(tuple(tensor.shape), tuple(fsdp_ranks))
    (box,) = layout.boxes_of(fsdp_ranks[rank])
    mine = tensor[box.slices()].clone()
    return _make_st(layout, fsdp_ranks[rank], [(box, mine)], tensor, pg)


@functools.lru_cache(maxsize=256)
def _chunk_layout(shape: tuple[int, ...], ranks: tuple[int, ...]) -> Layout:
    # Cached as mesh_fsdp_layout is: every FSDP rank asks for the same O(ranks) layout.
    return chunk_layout(shape, 0, ranks)


def gather_fsdp_dim(tensor: DTensor) -> torch.Tensor:
    """The TP-local tensor of a 2-D DTensor: gather along its one FSDP-sharded mesh dim (the
    Shard-like placement that is not the last one), padding uneven chunks for gloo."""
    mesh = tensor.device_mesh
    pls = [from_torch(p) for p in tensor.placements]
    shape = tuple(tensor.shape)
    dp_dims = [j for j, p in enumerate(pls[:-1]) if not isinstance(p, Replicate)]
    local = tensor.to_local()
    if not dp_dims:
        return local
    if len(dp_dims) != 1:
        raise ConversionError(
            f"all_gather_dtensor handles one FSDP-sharded mesh dim; placements {tensor.placements}"
        )
    (j,) = dp_dims
    coord = mesh.get_coordinate()
    assert coord is not None
    mesh_shape = tuple(mesh.mesh.shape)
    gathered_pls = list(pls)
    gathered_pls[j] = Replicate()
    target = [
        p.indices()
        for p in local_pieces(shape, mesh_shape, [to_split(p) for p in gathered_pls], coord)
    ]
    d = pls[j].dim  # type: ignore[union-attr]
    k = mesh_shape[j]
    splits = [to_split(p) for p in pls]
    peer_idx = []
    for c in range(k):
        pc = list(coord)
        pc[j] = c
        peer_idx.append(local_pieces(shape, mesh_shape, splits, pc)[d].indices())
    width = max(len(ix) for ix in peer_idx)
    pad_shape = list(local.shape)
    pad_shape[d] = width
    buf = local.new_zeros(pad_shape)
    buf.narrow(d, 0, local.shape[d]).copy_(local)
    outs = [torch.empty_like(buf) for _ in range(k)]
    dist.all_gather(outs, buf.contiguous(), group=mesh.get_group(j))
    out_shape = [len(ix) for ix in target]
    result = local.new_empty(out_shape)
    where = {g: i for i, g in enumerate(target[d])}
    for c in range(k):
        if not peer_idx[c]:
            continue
        pos = torch.tensor([where[g] for g in peer_idx[c]], dtype=torch.long)
        result.index_copy_(d, pos, outs[c].narrow(d, 0, len(peer_idx[c])))
    return result


# Installing ---------------------------------------------------------------------------------


def install(model: Any = None, extension: DTensorExtensions | None = None) -> DTensorExtensions:
    """Use ``extension`` (a new :class:`DTensorExtensions` by default) for FSDP1 + TP.

    With ``model``: set it on every FSDP state of the wrapped model and on every flat-parameter
    handle (torch keeps one extension per state since 2.4; a model wrapped without a
    ``device_mesh`` has flattened its parameters without TP awareness, so that raises). Without
    ``model``: make it the default for models wrapped from now on, through whichever hook this
    torch has (``_init_utils.DTensorExtensions`` on per-state versions, the global
    ``_set_fsdp_extensions`` on older ones). Raises RuntimeError when this torch has neither.
    """
    from torch.distributed.fsdp import _fsdp_extensions, _init_utils

    ext = extension if extension is not None else DTensorExtensions()
    per_state = hasattr(_init_utils, "_init_extension")
    if model is None:
        if per_state and hasattr(_init_utils, "DTensorExtensions"):
            # _init_extension looks the class up in its module at wrap time.
            _init_utils.DTensorExtensions = _Factory(ext)  # type: ignore[attr-defined]
        elif hasattr(_fsdp_extensions, "_set_fsdp_extensions"):
            _fsdp_extensions._set_fsdp_extensions(ext)
        else:
            raise RuntimeError(
                f"torch {torch.__version__} has neither per-state FSDP extensions "
                "(_init_utils._init_extension) nor _fsdp_extensions._set_fsdp_extensions; "
                "shardspec.fsdp cannot install its FSDP hooks on this version"
            )
        return ext
    from torch.distributed.fsdp._traversal_utils import _get_fsdp_handles, _get_fsdp_states

    states = _get_fsdp_states(model)
    if not states:
        raise ValueError(f"{type(model).__name__} has no FSDP state: wrap it with FSDP first")
    if not per_state:
        if not hasattr(_fsdp_extensions, "_set_fsdp_extensions"):
            raise RuntimeError(
                f"torch {torch.__version__}: no way to set FSDP extensions was found"
            )
        _fsdp_extensions._set_fsdp_extensions(ext)
        return ext
    for state in states:
        mesh: Any = getattr(state, "_device_mesh", None)
        if mesh is not None and mesh._get_root_mesh() == mesh:
            continue  # FSDP on a mesh of its own: no TP, nothing to extend (as upstream)
        state._fsdp_extension = ext
        if getattr(state, "_device_handle", None) is not None and ext.device_handle is None:
            ext.device_handle = state._device_handle
    for handle in _get_fsdp_handles(model):
        handle._fsdp_extension = ext
    return ext


class _Factory:
    """Stands in for the class ``_init_extension`` instantiates: hands out ``ext``."""

    def __init__(self, ext: DTensorExtensions) -> None:
        self.ext = ext

    def __call__(self, device_handle: Any = None) -> DTensorExtensions:
        if self.ext.device_handle is None:
            self.ext.device_handle = device_handle
        return self.ext
