"""The dtensor area: DTensor boxes on N-D meshes and DTensor's own moves (DTENSOR-*:
spec/03-dtensor.md).

Its tests: ``conformance/tests/test_dtensor.py``, ``conformance/tests/test_dtensor_moves.py``,
``conformance/tests/test_convert.py``. An adapter takes part by subclassing :class:`DTensorArea`
(with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.interface.base import Adapter
from shardspec.metadata import Box


class DTensorArea(Adapter):
    """DTensor boxes on N-D meshes and DTensor's own moves (DTENSOR-*: spec/03-dtensor.md)."""

    area = "dtensor"

    def dtensor_local_boxes(
        self,
        shape: Sequence[int],
        mesh_shape: Sequence[int],
        placements: Sequence[Any],
        coord: Sequence[int],
    ) -> list[Box]:
        """The boxes of the local tensor at mesh ``coord``, in local storage order."""
        raise self.unsupported("DTensor boxes")

    def dtensor_mesh_boxes(
        self, shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any]
    ) -> list[list[Box]]:
        """The boxes of every mesh coordinate's local tensor (row-major over the mesh), as
        the implementation builds a DTensor's whole layout (a checkpoint load does, for every
        rank of the job). By default, :meth:`dtensor_local_boxes` at each coordinate."""
        import itertools

        return [
            self.dtensor_local_boxes(shape, mesh_shape, placements, c)
            for c in itertools.product(*(range(k) for k in mesh_shape))
        ]

    def dtensor_chunks(
        self, pool: Any, tensor: Any, mesh: Sequence[int], placements: Any, example: str
    ) -> list[Any]:
        """A real DTensor on the pool's ranks: per rank, ``value["chunks"]`` (the DCP chunk
        list it reports, as [offsets, sizes]) and, where the implementation reads layouts,
        ``value["layout"]`` (``from_dtensor``); the local tensor."""
        args = {
            "mesh": list(mesh),
            "placements": placements,
            "scatter": not any(p[0] == "SS" for p in placements),
        }
        return self._run_via(  # type: ignore[no-any-return]
            "DTensor chunk lists", pool, "convert.dtensor", args, tensors=[tensor], example=example
        )

    def dtensor_distribute(
        self,
        pool: Any,
        tensor: Any,
        mesh: Sequence[int],
        order: Sequence[int],
        placements: Any,
        example: str,
    ) -> list[Any]:
        """The implementation's ``distribute_tensor`` from rank 0 on a mesh of ``mesh`` shape
        listing the pool's ranks in ``order`` (row-major): per rank ``value["coordinate"]``
        and the local tensor."""
        args = {"mesh": list(mesh), "order": list(order), "placements": placements}
        return self._run_via(  # type: ignore[no-any-return]
            "distribute_tensor",
            pool,
            "dtensor.distribute",
            args,
            tensors=[tensor],
            example=example,
        )

    def dtensor_redistribute(
        self,
        pool: Any,
        tensor: Any,
        mesh: Sequence[int],
        order: Sequence[int],
        flatten: bool,
        src: Any,
        dst: Any,
        example: str,
    ) -> list[Any]:
        """A DTensor of ``tensor`` with placements ``src`` moved to ``dst`` by the
        implementation (torch: ``redistribute`` and ``full_tensor``), on a mesh listing the
        pool's ranks in ``order``, its dims flattened when ``flatten``: per rank
        ``value["coordinate"]``, the local tensor after the move and the full tensor."""
        args = {
            "mesh": list(mesh),
            "order": list(order),
            "flatten": flatten,
            "placements": src,
            "dst": dst,
        }
        return self._run_via(  # type: ignore[no-any-return]
            "redistribute",
            pool,
            "dtensor.redistribute",
            args,
            tensors=[tensor],
            example=example,
        )

    def dtensor_from_local(
        self,
        pool: Any,
        locals_: Sequence[Any],
        placements: Any,
        shape: Sequence[int],
        example: str,
    ) -> list[Any]:
        """``DTensor.from_local`` of rank r's ``locals_[r]`` on a 1-D mesh of the pool's
        ranks with global ``shape``: per rank ``value["error"]`` (the refusal) or
        ``value["box"]`` (the [offsets, sizes] its DTensor states for that rank)."""
        args = {"mesh": [pool.world_size], "placements": placements, "shape": list(shape)}
        return self._run_via(  # type: ignore[no-any-return]
            "DTensor.from_local",
            pool,
            "dtensor.from_local",
            args,
            per_rank_tensors=[[t] for t in locals_],
            example=example,
        )
