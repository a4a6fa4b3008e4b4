"""A drop-in ``FSDPExtensions`` for FSDP1 + TP whose metadata comes from the layout rules.

torch's ``DTensorExtensions`` (tensor/parallel/fsdp.py) reports uneven TP shards at floor
offsets, names a scapegoat rank as the owner of every shard but its own, and builds the
``SHARDED_STATE_DICT`` DTensor by ``redistribute``-ing a DTensor whose placements misdescribe
the data, which aborts gloo for uneven TP shards. Here every local chunk is cut locally (no
collective) and every box and owner comes from :mod:`shardspec.fsdp.rules` (FSDP-6), laid on
the mesh by :mod:`shardspec.fsdp.mesh`; the ShardedTensors are built in
:mod:`shardspec.fsdp.sharded` and gathered back in :mod:`shardspec.fsdp.gather`.

``install(model)`` puts an instance on every FSDP state and flat-parameter handle of a wrapped
model (torch >= 2.4 keeps one per state); ``install()`` makes it the default for models
wrapped afterwards (FSDP-7).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.fsdp
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharded_tensor.shard import Shard as STShard
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp._fsdp_extensions import FSDPExtensions
from torch.distributed.tensor import DTensor

from shardspec.metadata import Box, ConversionError, Layout, Shard, chunk_bounds
from shardspec.metadata.placements import Replicate, from_torch, to_torch

from .gather import gather_flat_sharded_tensor, gather_fsdp_dim
from .mesh import exact_placements, mesh_fsdp_layout, root_roles, submesh_dims
from .rules import tp_box
from .sharded import LAYOUT_ATTR, chunk_sharded_tensor, flat_sharded_tensor, make_sharded_tensor

__all__ = ["DTensorExtensions", "install"]


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
        return chunk_sharded_tensor(tensor.detach(), rank, fsdp_ranks, pg)

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
        inner = chunk_sharded_tensor(local, rank, fsdp_ranks, pg)
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
        st = make_sharded_tensor(outer, me, [(my_outer, inner)], local, tp_mesh.get_group())
        st.metadata().tensor_properties.requires_grad = False
        roles = root_roles(tp_mesh, fsdp_ranks)
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
        inner = chunk_sharded_tensor(outer_shard.tensor.detach(), rank, fsdp_ranks, pg)
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
        shard_dim = submesh_dims(root, device_mesh)[-1]
        shape = tuple(tensor.shape)
        if isinstance(tensor, DTensor):
            tp_mesh = tensor.device_mesh
            if tp_mesh.ndim != 1:
                raise ConversionError(f"chunk_dtensor handles a 1-D TP mesh; got {tp_mesh}")
            (tp_dim,) = submesh_dims(root, tp_mesh)
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
        placements = exact_placements(shape, mesh_shape, tp, tp_dim, tp_size, shard_dim)
        coord = root.get_coordinate()
        assert coord is not None
        p = coord[shard_dim]
        lo, hi = chunk_bounds(local.shape[0], mesh_shape[shard_dim])[p]
        mine = local[lo:hi].clone().contiguous()
        if placements is None:
            # No DTensor can say where these rows are (FSDP-5): a flat ShardedTensor can.
            return flat_sharded_tensor(shape, tp, tp_dim, shard_dim, root, mine)
        contiguous_stride = _contiguous_stride(shape)
        return DTensor.from_local(
            mine,
            root,
            [to_torch(pl) for pl in placements],
            run_check=False,
            shape=torch.Size(shape),
            stride=contiguous_stride,
        )

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


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride = []
    acc = 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


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
