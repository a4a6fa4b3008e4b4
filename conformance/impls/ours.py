"""The adapter for shardspec itself."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from conformance.interface import Impl
from conformance.interface.flat import Piece
from shardspec.metadata import (
    Box,
    FlatLayout,
    FlatPiece,
    Layout,
    LayoutError,
    chunk_layout,
    flat_from_layout,
)


class ShardspecImpl(Impl):
    name = "shardspec"
    via = "shardspec"

    def version(self) -> str:
        from importlib import metadata

        try:
            return metadata.version("shardspec-metadata")
        except metadata.PackageNotFoundError:
            return "not installed (run from the source tree)"

    def is_valid(self, layout: Layout) -> bool:
        try:
            layout.validate()
        except LayoutError:
            return False
        return True

    def chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        return chunk_layout(shape, dim, ranks)

    def flat_range_boxes(self, shape: Sequence[int], start: int, stop: int) -> list[Box]:
        from shardspec.metadata.flat import range_boxes

        return range_boxes(shape, start, stop)

    def flat_is_valid(self, shape: Sequence[int], pieces: Sequence[Piece]) -> bool:
        try:
            FlatLayout(shape, [FlatPiece(*p) for p in pieces]).validate()
        except LayoutError:
            return False
        return True

    def flat_boxes_by_rank(
        self, shape: Sequence[int], pieces: Sequence[Piece]
    ) -> dict[int, list[Box]]:
        layout = FlatLayout(shape, [FlatPiece(*p) for p in pieces]).to_layout()
        return {r: list(layout.boxes_of(r)) for r in layout.ranks}

    def flat_pieces_of_boxes(
        self, shape: Sequence[int], boxes: Sequence[tuple[Box, int]]
    ) -> list[Piece]:
        flat = flat_from_layout(Layout.from_boxes(shape, boxes))
        return [(p.rank, p.start, p.stop, p.at) for p in flat.pieces]

    def zero12_pieces(
        self, shapes: Sequence[Sequence[int]], dp: int, alignment: int, round_robin: bool
    ) -> list[list[Piece]]:
        from shardspec.metadata.flat import zero12_partition

        part = zero12_partition(shapes, dp, alignment=alignment, round_robin=round_robin)
        return [
            [(p.rank, p.start, p.stop, p.at) for p in flat.pieces if p.numel]
            for flat in part.layouts
        ]

    def zero3_pieces(self, shape: Sequence[int], dp: int) -> list[Piece]:
        from shardspec.metadata.flat import zero3_layout

        return [(p.rank, p.start, p.stop, p.at) for p in zero3_layout(shape, dp).pieces]

    def reshard_chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        return chunk_layout(shape, dim, ranks)  # one rule for every path (CHUNK-1, CHUNK-2)

    def dtensor_local_boxes(
        self,
        shape: Sequence[int],
        mesh_shape: Sequence[int],
        placements: Sequence[Any],
        coord: Sequence[int],
    ) -> list[Box]:
        try:
            from shardspec.metadata.dtensor import dtensor_local_boxes
        except ImportError as e:
            raise self.unsupported(f"shardspec.metadata.dtensor is not available ({e})") from None
        from conformance.codec import placements_from_json

        return list(dtensor_local_boxes(shape, mesh_shape, placements_from_json(placements), coord))

    def dtensor_mesh_boxes(
        self, shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any]
    ) -> list[list[Box]]:
        try:
            from shardspec.metadata.dtensor import dtensor_layout
        except ImportError as e:
            raise self.unsupported(f"shardspec.metadata.dtensor is not available ({e})") from None
        from conformance.codec import placements_from_json

        # a mesh of ranks 0..W-1 in row-major order, as a nested list (DTensor's mesh form)
        mesh: Any = list(range(math.prod(mesh_shape)))
        for k in reversed(mesh_shape[1:]):
            mesh = [mesh[i : i + k] for i in range(0, len(mesh), k)]
        layout = dtensor_layout(shape, mesh, placements_from_json(placements))
        return [list(layout.boxes_of(r)) for r in range(math.prod(mesh_shape))]

    def fsdp_local_boxes(self, pool: Any, tensor: Any, dim: int) -> list[tuple[Box, Any]]:
        results = pool.run(
            "dtensor.distribute",
            {"mesh": [pool.world_size], "placements": [["S", dim]]},
            [tensor],
        )
        layout = chunk_layout(tuple(tensor.shape), dim, range(pool.world_size))
        return [(layout.boxes_of(r.rank)[0], r.tensors[0]) for r in results]

    def fsdp_tp_chunks(
        self, pool: Any, tensor: Any, mesh: Sequence[int], tp: list[Any], hook: str
    ) -> list[tuple[list[Box], Any]]:
        results = pool.run(
            "fsdp.tp_chunk",
            {"mesh": list(mesh), "tp": tp, "impl": "shardspec", "hook": hook},
            [tensor],
        )
        return [([Box(o, s) for o, s in r.value["boxes"]], r.tensors[0]) for r in results]

    def fsdp_tp_gathers(
        self, pool: Any, tensor: Any, mesh: Sequence[int], tp: list[Any]
    ) -> list[list[Any]]:
        results = pool.run(
            "fsdp.tp_chunk",
            {"mesh": list(mesh), "tp": tp, "impl": "shardspec", "hook": "dtensor", "gather": True},
            [tensor],
        )
        return [list(r.tensors[1:]) for r in results]

    def infer_chunk(self, layout: Layout) -> tuple[int, list[int]] | None:
        try:
            from shardspec.metadata.infer import infer_spec
            from shardspec.metadata.specs import ChunkSpec
        except ImportError as e:
            raise self.unsupported(f"shardspec.metadata.infer is not available ({e})") from None
        spec = infer_spec(layout)
        if isinstance(spec, ChunkSpec):
            return spec.dim, list(spec.ranks)
        return None

    def inferred_layout(self, layout: Layout) -> Layout:
        from shardspec.metadata import infer_spec

        return infer_spec(layout).layout(layout.shape)

    def sharding_spec(self, layout: Layout) -> Any:
        from shardspec.metadata import ConversionError, to_sharding_spec

        try:
            return to_sharding_spec(layout)
        except ConversionError as e:  # replicas, zero-size shards torch refuses (CONVERT-5)
            raise self.unsupported(f"torch's sharding specs cannot express it: {e}") from None

    def layout_to_json(self, layout: Layout) -> str:
        from shardspec.metadata import layout_to_json

        return layout_to_json(layout)

    def layout_from_json(self, text: str | bytes) -> Layout:
        from shardspec.metadata import layout_from_json

        return layout_from_json(text)

    def checkpoint_accepts(self, shape: Sequence[int], chunks: Sequence[Box]) -> bool:
        from shardspec.checkpoint.chunks import check_chunks
        from shardspec.metadata import LayoutError

        try:
            check_chunks("t", tuple(shape), [(b.offsets, b.sizes) for b in chunks])
        except LayoutError:
            return False
        return True

    def checkpoint_load(
        self, shape: Sequence[int], chunks: Sequence[Box], tensor: Any
    ) -> tuple[Any, int]:
        from conformance.impls.dcp_memory import load_through_planner
        from shardspec.checkpoint.dcp import LoadPlanner as Planner

        return load_through_planner(Planner(), shape, chunks, tensor)

    def checkpoint_reads(
        self, shape: Sequence[int], saved: Sequence[Box], local: Sequence[Box]
    ) -> list[tuple[int, int, Box]]:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        from conformance.impls.dcp_memory import checkpoint_storage, read_regions
        from shardspec.checkpoint.dcp import read_items_for_chunks

        mine = [ChunkStorageMetadata(list(b.offsets), list(b.sizes)) for b in local]
        return read_regions(read_items_for_chunks("t", checkpoint_storage(shape, saved), mine))

    def checkpoint_offline(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        target: dict[str, Any],
        how: str,
        example: str,
    ) -> dict[str, Any]:
        import os
        import tempfile

        import torch

        from conformance.codec import layout_to_json

        dtype = str(tensor.dtype).removeprefix("torch.")
        shape = list(tensor.shape)
        wire = dict(target)
        if target["kind"] == "sharded":
            wire["layout"] = layout_to_json(target["layout"])
        facts: dict[str, Any] = {"chunks": [], "loaded": []}
        with tempfile.TemporaryDirectory(prefix="shardspec-offline-") as tmp:
            src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
            self._dcp_save(save_pool, src, saved, tensor, example)
            if how == "like":
                like = os.path.join(tmp, "like")
                self._dcp_save(load_pool, like, target["layout"], torch.zeros_like(tensor), example)
                facts["like_chunks"] = _saved_chunks(like)
                argv = ["reshard", src, dst, "--like", like]
            else:
                args = {**wire, "dtype": dtype, "fill": 0, "shape": shape}
                zeros = _filled(target, tensor.dtype, 0, load_pool.world_size)
                results = self._run_via(
                    "layouts_of",
                    load_pool,
                    "checkpoint.layouts_of",
                    args,
                    per_rank_tensors=zeros,
                    example=example,
                )
                layouts = os.path.join(tmp, "layouts.json")
                with open(layouts, "w", encoding="utf-8") as f:
                    f.write(results[0].value["layouts"])
                argv = ["reshard", src, dst, "--layouts", layouts]
            facts["rc"], _, facts["stderr"] = _command(argv)
            if facts["rc"] != 0:
                return facts
            facts["chunks"] = _saved_chunks(dst)
            load = {**wire, "path": dst, "dtype": dtype, "fill": 1, "shape": shape, "plain": True}
            facts["loaded"] = self._run_via(
                "DCP load",
                load_pool,
                "checkpoint.load",
                load,
                per_rank_tensors=_filled(target, tensor.dtype, 1, load_pool.world_size),
                example=example,
            )
        return facts

    def checkpoint_diff_values(
        self,
        pool_a: Any,
        pool_b: Any,
        a: Layout,
        tensor_a: Any,
        b: Layout,
        tensor_b: Any,
        options: Sequence[str],
        example: str,
    ) -> dict[str, Any]:
        import json
        import os
        import tempfile

        with tempfile.TemporaryDirectory(prefix="shardspec-diff-") as tmp:
            path_a, path_b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
            self._dcp_save(pool_a, path_a, a, tensor_a, example)
            self._dcp_save(pool_b, path_b, b, tensor_b, example)
            argv = ["diff", path_a, path_b, "--values", "--progress", "never", *options]
            rc, out, err = _command(argv)
            json_rc, json_out, json_err = _command([*argv, "--json"])
        return {
            "rc": rc,
            "out": out,
            "stderr": err + json_err,
            "json_rc": json_rc,
            "json": json.loads(json_out) if json_out.strip() else None,
        }

    def reshard(
        self,
        pool: Any,
        src: Layout,
        dst: Layout,
        tensor: Any,
        *,
        max_buffer_bytes: int | None = None,
        noncontig: bool = False,
        example: str | None = None,
    ) -> list[Any]:
        from conformance.codec import layout_to_json

        args = {
            "src": layout_to_json(src),
            "dst": layout_to_json(dst),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "max_buffer_bytes": max_buffer_bytes,
            "noncontig": noncontig,
        }
        inputs = [
            [tensor[b.slices()].contiguous() for b in src.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        return list(pool.run("reshard.shardspec", args, per_rank_tensors=inputs, example=example))

    def reshard_state_dict(
        self, pool: Any, entries: list[dict[str, Any]], budget: int | None, example: str
    ) -> list[Any]:
        return self.reshard_state_dict_on(pool, list(range(pool.world_size)), entries, budget,
                                          example, whole=True)  # fmt: skip

    def reshard_state_dict_on(
        self,
        pool: Any,
        members: list[int],
        entries: list[dict[str, Any]],
        budget: int | None,
        example: str,
        *,
        whole: bool = False,
    ) -> list[Any]:
        from conformance.codec import layout_to_json

        wire = [
            {
                "key": e["key"],
                "src": layout_to_json(e["src"]),
                "dst": layout_to_json(e["dst"]),
                "dtype": str(e["tensor"].dtype).removeprefix("torch."),
                "out": e["out"],
                "pad": e["pad"],
            }
            for e in entries
        ]
        inputs = [
            [
                e["tensor"][b.slices()].contiguous()
                for e in entries
                for b in e["src"].boxes_of(members.index(r))
            ]
            if r in members
            else []
            for r in range(pool.world_size)
        ]
        # the whole pool: the default group, as a user passes none
        args = {"entries": wire, "budget": budget, "members": None if whole else list(members)}
        return list(pool.run("reshard.state_dict", args, per_rank_tensors=inputs, example=example))

    def reshard_checked(
        self,
        pool: Any,
        entries: list[dict[str, Any]],
        *,
        api: str,
        copies: dict[int, dict[str, dict[str, Layout]]] | None = None,
        inputs: list[list[Any]] | None = None,
        check_replicas: bool = False,
        out: bool = False,
        noncontig: bool = False,
        example: str,
    ) -> list[Any]:
        from conformance.codec import layout_to_json

        copies = copies or {}

        def own(rank: int, e: dict[str, Any], side: str) -> Layout:
            return copies.get(rank, {}).get(e["key"], {}).get(side, e[side])  # type: ignore[no-any-return]

        if inputs is None:
            inputs = [
                [
                    e["tensor"][b.slices()].contiguous()
                    for e in entries
                    for b in own(r, e, "src").boxes_of(r)
                ]
                for r in range(pool.world_size)
            ]
        args = {
            "entries": [
                {
                    "key": e["key"],
                    "src": layout_to_json(e["src"]),
                    "dst": layout_to_json(e["dst"]),
                    "dtype": str(e["tensor"].dtype).removeprefix("torch."),
                }
                for e in entries
            ],
            "copies": {
                str(r): {
                    k: {side: layout_to_json(lay) for side, lay in sides.items()}
                    for k, sides in per_key.items()
                }
                for r, per_key in copies.items()
            },
            "api": api,
            "check_replicas": check_replicas,
            "out": out,
            "noncontig": noncontig,
        }
        return list(pool.run("reshard.checked", args, per_rank_tensors=inputs, example=example))

    # Refit (REFIT-*)
    def refit(
        self,
        pool: Any,
        recipe: Any,
        rounds: list[dict[str, Any]],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        example: str,
    ) -> list[list[dict[str, list[Any]]]]:
        from conformance.impls.refit_wire import run_refit

        return run_refit(pool, "refit.shardspec", recipe, rounds, src, dst, example)

    def refit_on(
        self,
        pool: Any,
        members: list[int],
        recipe: Any,
        rounds: list[dict[str, Any]],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        example: str,
    ) -> list[list[dict[str, list[Any]]]]:
        from conformance.impls.refit_wire import run_refit

        return run_refit(pool, "refit.shardspec", recipe, rounds, src, dst, example, members)

    def packed_layout(
        self,
        shape: tuple[int, ...],
        dim: int,
        part_sizes: list[int],
        ranks: list[int],
        unit: int,
        replicate: tuple[int, ...],
    ) -> Layout:
        from shardspec.refit import packed_layout

        return packed_layout(shape, dim, part_sizes, ranks, unit, replicate=replicate)

    def refit_refused(
        self,
        pool: Any,
        recipe: Any,
        sources: dict[str, Any],
        src: dict[str, Layout],
        dst: dict[str, Layout],
        *,
        fault: dict[str, Any],
        example: str,
    ) -> list[dict[str, Any]]:
        from conformance.codec import layout_to_json
        from conformance.impls.refit_wire import wire

        args, inputs = wire(pool, recipe, [sources], src, dst)
        args["fault"] = {k: layout_to_json(v) if k == "layout" else v for k, v in fault.items()}
        results = pool.run("refit.refused", args, per_rank_tensors=inputs, example=example)
        return [r.value for r in results]

    # TorchRec (TORCHREC-*)
    def torchrec_layout(
        self,
        sharding_type: str,
        shape: Sequence[int],
        world_size: int,
        local_size: int,
        params: dict[str, Any],
    ) -> Layout:
        from shardspec import torchrec as tr

        p = params
        if sharding_type == "data_parallel":
            return tr.data_parallel(shape, world_size)
        if sharding_type == "table_wise":
            return tr.table_wise(shape, p["rank"])
        if sharding_type == "row_wise":
            return tr.row_wise(shape, world_size)
        if sharding_type == "column_wise":
            return tr.column_wise(shape, p["ranks"])
        if sharding_type == "table_row_wise":
            return tr.table_row_wise(shape, p["host_index"], local_size)
        if sharding_type == "table_column_wise":
            return tr.table_column_wise(
                shape, p["ranks"], local_size, block_size=p.get("block_size")
            )
        if sharding_type == "grid_shard":
            return tr.grid_shard(shape, p["host_indexes"], local_size)
        raise self.unsupported(f"sharding type {sharding_type!r}")

    def shards_wrapper(
        self, shards: Sequence[Any], offsets: Sequence[Sequence[int]]
    ) -> tuple[tuple[int, ...], list[Box]]:
        from shardspec.torchrec.wrapper import LocalShardsWrapper

        w = LocalShardsWrapper(list(shards), [tuple(o) for o in offsets])
        return tuple(w.shape), [Box(tuple(c.offsets), tuple(c.sizes)) for c in w.local_chunks]

    def wrapper_object(self, shards: Sequence[Any], offsets: Sequence[Sequence[int]]) -> Any:
        from shardspec.torchrec.wrapper import LocalShardsWrapper

        return LocalShardsWrapper(list(shards), [tuple(o) for o in offsets])


def _filled(target: dict[str, Any], dtype: Any, value: int, world: int) -> list[list[Any]]:
    """Per rank, its boxes of a ShardedTensor target, every element ``value`` (a DTensor
    target is made on the ranks: nothing to send)."""
    import torch

    if target["kind"] != "sharded":
        return [[] for _ in range(world)]
    one = torch.full((), value, dtype=dtype)
    return [
        [one.expand(b.sizes).contiguous() for b in target["layout"].boxes_of(r)]
        for r in range(world)
    ]


def _command(argv: list[str]) -> tuple[int, str, str]:
    """``shardspec ARGV`` in this process: exit status, stdout, stderr."""
    import contextlib
    import io

    from shardspec.checkpoint.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _saved_chunks(path: str) -> list[tuple[Box, str | None]]:
    """The saved chunks of tensor ``t`` of the checkpoint at ``path`` and the file of each
    (None for a chunk without a storage entry), as DCP's own reader reads its metadata."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import MetadataIndex

    md = FileSystemReader(path).read_metadata()
    out: list[tuple[Box, str | None]] = []
    for c in md.state_dict_metadata["t"].chunks:
        info = md.storage_data.get(MetadataIndex("t", c.offsets))
        out.append((Box(tuple(c.offsets), tuple(c.sizes)), getattr(info, "relative_path", None)))
    return out
