"""The adapter interface every implementation under test answers (see the package docstring).

A method an implementation cannot answer raises :class:`Unsupported` with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from shardspec.metadata import Box, Layout

__all__ = ["Impl", "KnownDefect", "Unsupported"]


class Unsupported(Exception):
    """The implementation under test cannot express or perform this case."""


@dataclass(frozen=True)
class KnownDefect:
    """A known defect of the implementation, declared by its adapter (``Impl.known_defects``):
    the test is a strict expected failure when that adapter is under test, and its failure
    must be a ``raises`` whose message ``match`` (a regular expression) is found in (CONF-14),
    exactly as a ``@pytest.mark.known_defect(name, reason, ...)`` mark in the suite."""

    reason: str
    raises: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    issue: str | None = None

    def __post_init__(self) -> None:
        kinds = self.raises if isinstance(self.raises, tuple) else (self.raises,)
        exceptions = all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds)
        if not kinds or not exceptions:
            raise TypeError(f"KnownDefect.raises must be exception types, got {self.raises!r}")
        if not isinstance(self.match, str) or not self.match.strip():
            raise TypeError(f"KnownDefect.match must be a non-empty pattern, got {self.match!r}")
        re.compile(self.match)  # a bad pattern fails where it is written


class Impl:
    """The adapter interface; every method defaults to :class:`Unsupported`.

    Layouts are :class:`shardspec.metadata.Layout`; placements are the JSON form
    (``["S", d]``, ``["R"]``, ``["SS", d, split_factor]``).
    """

    # How the report and "unsupported by <name>" name it; known_defect marks of the suite name
    # an adapter by it. An adapter that states none is named by its "module:Class".
    name = "?"
    # Which code the converter operations run on the ranks (conformance/ops_convert.py):
    # "shardspec", "torch", or None when the implementation has no converters.
    via: str | None = None
    # Modules every pool rank imports, besides conformance.OPS, to register the named
    # operations this adapter runs there (shardspec.testing.ops.operation); a module that
    # registers its own on import lists itself: ``rank_ops = (__name__,)``.
    rank_ops: ClassVar[tuple[str, ...]] = ()
    # The implementation's known defects, by test: a test function's name (every
    # parametrization of it) or a node id pattern with "::" ("conformance/tests/
    # test_chunk.py::test_fsdp_*"), each a strict expected failure of its own failure.
    known_defects: ClassVar[Mapping[str, KnownDefect]] = MappingProxyType({})

    def version(self) -> str:
        """The implementation's version (its package's), for the report's header."""
        return "unknown"

    def unsupported(self, what: str) -> Unsupported:
        return Unsupported(f"unsupported by {self.name}: {what}")

    # validation (LAYOUT-1..3, BOX-2)
    def is_valid(self, layout: Layout) -> bool:
        """True when the implementation's validator accepts ``layout``."""
        raise self.unsupported("validation")

    # the chunk rule (CHUNK-*)
    def chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        """The layout of chunking ``dim`` over ``ranks`` (chunk i on ranks[i])."""
        raise self.unsupported("chunk layouts")

    def reshard_chunk_layout(self, shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
        """The chunk layout as the implementation's resharding path computes it."""
        raise self.unsupported("reshard chunk layouts")

    # DTensor boxes
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

    def fsdp_local_boxes(self, pool: Any, tensor: Any, dim: int) -> list[tuple[Box, Any]]:
        """For a DTensor chunked on ``dim`` of a 1-D mesh of the pool's ranks: each rank's box as
        the FSDP state-dict path reports it, and the local tensor it really holds."""
        raise self.unsupported("FSDP boxes")

    # specs
    def fsdp_tp_chunks(
        self, pool: Any, tensor: Any, mesh: Sequence[int], tp: list[Any], hook: str
    ) -> list[tuple[list[Box], Any]]:
        """FSDP + TP on a ``(dp, tp)`` mesh of the pool's ranks: per rank, the boxes the FSDP1
        state-dict hook (``hook`` = ``"dtensor"``: ``chunk_dtensor``; ``"tensor"``:
        ``chunk_tensor``) states for its chunk of its TP piece (TP placement ``tp``), and the
        data it holds."""
        raise self.unsupported("FSDP + TP state-dict hooks")

    def fsdp_tp_gathers(
        self, pool: Any, tensor: Any, mesh: Sequence[int], tp: list[Any]
    ) -> list[list[Any]]:
        """FSDP + TP as :meth:`fsdp_tp_chunks` with ``chunk_dtensor``, then gathered back along
        the FSDP dim: per rank, what ``all_gather_dtensor`` on the root mesh returns and what
        the implementation's optimizer-state path (where it has one) turns the same entry
        into. Each must be the rank's TP piece."""
        raise self.unsupported("FSDP + TP gathers")

    def infer_chunk(self, layout: Layout) -> tuple[int, list[int]] | None:
        """The (dim, rank order) of the chunk spec inferred from ``layout``, or None when
        the implementation infers an enumerable spec."""
        raise self.unsupported("spec inference")

    def inferred_layout(self, layout: Layout) -> Layout:
        """The layout the spec inferred from ``layout`` gives for ``layout.shape`` (SPEC-3:
        ``infer_spec(L).layout(L.shape)``), ranks included."""
        raise self.unsupported("spec inference")

    def sharding_spec(self, layout: Layout) -> Any:
        """The torch sharding spec (``ChunkShardingSpec`` or ``EnumerableShardingSpec``) the
        implementation converts ``layout`` to (CONVERT-3)."""
        raise self.unsupported("torch sharding specs from a layout")

    # the serialized form (CONVERT-8, CONVERT-9)
    def layout_to_json(self, layout: Layout) -> str:
        """The layout as the spec's versioned JSON text."""
        raise self.unsupported("the serialized layout form")

    def layout_from_json(self, text: str | bytes) -> Layout:
        """The layout a JSON text holds; raises ``shardspec.metadata.LayoutError`` naming the
        JSON path of the bad field when the text is malformed."""
        raise self.unsupported("the serialized layout form")

    # checkpoints (CKPT-*, spec/09-checkpoint.md)
    def checkpoint_accepts(self, shape: Sequence[int], chunks: Sequence[Box]) -> bool:
        """True when the implementation's check of a tensor's saved chunks (CKPT-1) accepts
        ``chunks`` (chunk ``i`` is the i-th box) of a tensor of ``shape``."""
        raise self.unsupported("checking a checkpoint's chunks")

    def checkpoint_load(
        self, shape: Sequence[int], chunks: Sequence[Box], tensor: Any
    ) -> tuple[Any, int]:
        """``dcp.load`` of a checkpoint whose chunks are ``chunks`` (of ``tensor``) through the
        implementation's load planner (:func:`load_through_planner`): the loaded tensor or the
        exception, and how many reads reached storage."""
        raise self.unsupported("loading a checkpoint through a load planner")

    def checkpoint_reads(
        self, shape: Sequence[int], saved: Sequence[Box], local: Sequence[Box]
    ) -> list[tuple[int, int, Box]]:
        """The reads the implementation's load planner makes to fill ``local`` from a
        checkpoint whose chunks are ``saved`` (CKPT-3): ``(saved index, local index, the
        region read, in global coordinates)``."""
        raise self.unsupported("planning checkpoint reads")

    def checkpoint_round_trip(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        example: str,
    ) -> list[Any]:
        """A real ``dcp.save`` on ``save_pool``'s ranks of a ShardedTensor holding ``saved``'s
        boxes of ``tensor``, then a real ``dcp.load`` on ``load_pool``'s ranks into ``load``:
        ``{"kind": "sharded", "layout": JSON}`` (a ShardedTensor) or ``{"kind": "dtensor",
        "mesh": [...], "placements": [...]}``, every element filled with 1 beforehand. Per
        load rank a RankResult whose tensors are its local tensors after the load."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="shardspec-ckpt-") as path:
            self._dcp_save(save_pool, path, saved, tensor, example)
            load_args = {**load, "path": path, "dtype": _dtype_name(tensor), "fill": 1,
                         "shape": list(tensor.shape)}  # fmt: skip
            return self._run_via(  # type: ignore[no-any-return]
                "DCP load", load_pool, "checkpoint.load", load_args,
                per_rank_tensors=_ones_of(load, tensor, load_pool.world_size), example=example,
            )  # fmt: skip

    def _dcp_save(
        self, pool: Any, path: str, saved: Layout, tensor: Any, example: str, **extra: Any
    ) -> None:
        """``checkpoint.save`` on the pool's ranks: ``saved``'s boxes of ``tensor`` (and
        ``extra`` arguments: ``values`` saved beside it) to ``path``."""
        from conformance.codec import layout_to_json

        args = {"path": path, "layout": layout_to_json(saved), "dtype": _dtype_name(tensor),
                **extra}  # fmt: skip
        inputs = [
            [tensor[b.slices()].contiguous() for b in saved.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        self._run_via(
            "DCP save", pool, "checkpoint.save", args, per_rank_tensors=inputs, example=example
        )

    def checkpoint_collective_load(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        reads: str,
        damage: str | None,
        example: str,
    ) -> list[Any]:
        """A real ``dcp.save`` on ``save_pool``'s ranks of ``{"t": ShardedTensor of saved's
        boxes of tensor, "v": {"n": 7}, "w": 5}``; then, when ``damage`` says so, the file
        holding the largest chunk of ``t`` is cut short (``truncate``), removed (``remove``),
        the ``.metadata`` replaced by junk (``metadata``), or the chunk list of ``t`` in it
        made to leave a gap (``gap``: the largest chunk left out) or to overlap (``overlap``:
        a chunk that stops short of the tensor's end in some dim moved one element along it,
        its stored bytes found at its new offset; a gap when no chunk can move), each chunk
        left finding bytes of its size; then the implementation's
        collective load (CKPT-23 to CKPT-27) on ``load_pool``'s ranks into ``{"t": load,
        "v": {"n": 0}, "w": 0}`` (``load`` as in :meth:`checkpoint_round_trip`, or ``{"kind":
        "plain"}``: a plain tensor on every rank) with ``reads``. Per load rank a RankResult
        whose value holds ``error`` (what the rank raised, or None), ``value`` (``{"v": ...,
        "w": ...}`` as loaded), ``stats`` (``reads``, ``data_bytes``, ``value_bytes``,
        ``ranges``: (file, start, stop) of each byte range read, or None when the
        implementation does not say) and whose tensors are its local tensors after the
        load."""
        import tempfile

        if self.via is None:
            raise self.unsupported("a collective checkpoint load")
        with tempfile.TemporaryDirectory(prefix="shardspec-cload-") as path:
            values = {"v": {"n": 7}, "w": 5}
            self._dcp_save(save_pool, path, saved, tensor, example, values=values)
            if damage is not None:
                _damage(path, damage)
            load_args = {**load, "path": path, "dtype": _dtype_name(tensor), "fill": 1,
                         "reads": reads, "shape": list(tensor.shape)}  # fmt: skip
            return self._run_via(  # type: ignore[no-any-return]
                "collective load", load_pool, "checkpoint.collective_load", load_args,
                per_rank_tensors=_ones_of(load, tensor, load_pool.world_size), example=example,
            )  # fmt: skip

    def checkpoint_safetensors_load(
        self, load_pool: Any, tensor: Any, files: int, load: dict[str, Any], reads: str,
        example: str,
    ) -> list[Any]:  # fmt: skip
        """A Hugging Face checkpoint of ``{"t": tensor}`` written by ``safetensors``'
        ``save_file`` beside other tensors (``files`` shards with their index JSON), loaded
        by the implementation's collective load (CKPT-22, CKPT-23) on ``load_pool``'s ranks
        into ``load`` as :meth:`checkpoint_collective_load` does (no values)."""
        import json
        import tempfile

        if self.via is None:
            raise self.unsupported("a collective load of a safetensors checkpoint")
        import torch
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="shardspec-hf-") as path:
            others = {f"layers.{i}.w": torch.full((i + 1, 3), i, dtype=tensor.dtype)
                      for i in range(2 * files - 1)}  # fmt: skip
            names = sorted(others) + ["t"]
            tensors = {**others, "t": tensor.contiguous()}
            weight_map = {}
            for k in range(files):
                fname = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
                part = names[k::files]
                save_file({n: tensors[n] for n in part}, f"{path}/{fname}")
                weight_map.update(dict.fromkeys(part, fname))
            with open(f"{path}/model.safetensors.index.json", "w", encoding="utf-8") as f:
                json.dump({"metadata": {}, "weight_map": weight_map}, f)
            args = {**load, "path": path, "dtype": _dtype_name(tensor), "fill": 1,
                    "reads": reads, "shape": list(tensor.shape), "safetensors": True}  # fmt: skip
            return self._run_via(  # type: ignore[no-any-return]
                "safetensors load", load_pool, "checkpoint.collective_load", args,
                per_rank_tensors=_ones_of(load, tensor, load_pool.world_size), example=example,
            )  # fmt: skip

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
        """Offline rewriting (CKPT-17): a real ``dcp.save`` on ``save_pool``'s ranks of a
        ShardedTensor holding ``saved``'s boxes of ``tensor``; the implementation's offline
        rewriting of it into the chunk layout of ``target`` (as :meth:`checkpoint_round_trip`'s
        ``load``, its layout a Layout), given as ``how`` says: ``layouts`` (the layouts file
        the target job writes) or ``like`` (a checkpoint the target job saved, in which rank r
        saved its boxes of the target); then a plain ``dcp.load`` (DCP's own planner and
        reader) on ``load_pool``'s ranks into ``target``, every element filled with 1
        beforehand. Returns ``rc`` and ``stderr`` of the rewriting, ``chunks`` of the
        rewritten tensor and, with ``like``, ``like_chunks`` of that checkpoint (each a list
        of ``(Box, file)``), and ``loaded``: per load rank a RankResult whose tensors are its
        local tensors after the load."""
        raise self.unsupported("rewriting a checkpoint offline into another chunk layout")

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
        """``diff A B --values`` (CKPT-7, CKPT-10) of two checkpoints, each a real ``dcp.save``
        (A on ``pool_a`` of ``a``'s boxes of ``tensor_a``, B likewise) of one tensor ``t``,
        with ``options`` (``--atol``/``--rtol``): ``rc`` and ``out`` of the text report,
        ``json_rc`` and ``json`` of the ``--json`` one."""
        raise self.unsupported("comparing two checkpoints' values (diff --values)")

    # a checkpoint library's own save and load (CKPT-19, CKPT-20): answered by the peers
    def checkpoint_written(self, pool: Any, layout: Layout, tensor: Any, path: str, ex: str) -> str:
        """Save a state dict of one ShardedTensor holding ``layout``'s boxes of ``tensor``
        (key ``"t"``) on the pool's ranks through the implementation's own checkpoint API,
        under directory ``path``; returns the directory holding its ``.metadata``."""
        raise self.unsupported("writing a checkpoint through its own checkpoint API")

    def checkpoint_model_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, dict[int, list[str]]]:
        """The FSDP area's uneven MLP (``shardspec.testing.fsdp_model``) after one Adam step,
        saved with its optimizer through the implementation's own checkpoint API as ``save``
        says (``kind`` "fsdp2" or "fsdp1", ``mesh``), loaded into a fresh model and optimizer
        as ``load`` says (``kind`` "fsdp2", "fsdp1" or "plain", ``mesh``). ``"load"``: per
        load rank, what differs from the saved full values (nothing: every value bit for
        bit); ``"save"``: per save rank, what DCP's full state dicts of the saved model and
        optimizer read differently after the save than before it (nothing)."""
        raise self.unsupported("saving and loading a model through its own checkpoint API")

    def checkpoint_damaged_load(
        self, save_pool: Any, load_pool: Any, damage: str, example: str
    ) -> dict[int, str]:
        """Save a small checkpoint through the implementation's own API on ``save_pool``,
        damage it (``damage``: "missing data file", "truncated data file", "no .metadata"),
        load it on ``load_pool``: per load rank, ``"refused: <its error>"``, ``"loaded"``, or
        ``"left waiting"`` (another rank failed and this one never returned)."""
        raise self.unsupported("loading a damaged checkpoint through its own checkpoint API")

    def checkpoint_extra_state(self, example: str) -> dict[str, Any]:
        """Save extra state (a step and NumPy's RNG state) beside a model through the
        implementation's own API and load it back on one rank: ``{"loaded": equal}`` or
        ``{"error": message}``."""
        raise self.unsupported("saving extra state through its own checkpoint API")

    def checkpoint_accepts_torch(self, release: str) -> bool:
        """Whether the implementation's own check of the torch release lets it save and
        load on ``release`` (e.g. "2.9.1")."""
        raise self.unsupported("a check of the torch release")

    def write_test_checkpoint(self, out: str) -> tuple[str, str]:
        """Rerun the generator of the small checkpoint of this implementation's own format
        that ``packages/checkpoint/tests/data`` holds, into ``out``: (the fresh checkpoint,
        the committed one), each a directory of ``model/`` and ``optimizer/``."""
        raise self.unsupported("a checkpoint of its own format in packages/checkpoint/tests/data")

    # checkpoint files (CKPT-4, CKPT-16, CKPT-21: conformance/tests/test_checkpoint_files.py)
    def checkpoint_grid_round_trip(
        self,
        save_pool: Any,
        load_pool: Any,
        parts: Sequence[int],
        copies: int,
        form: str,
        tensor: Any,
        load: dict[str, Any],
        example: str,
    ) -> list[Any]:
        """:meth:`checkpoint_round_trip` of the grid of ``parts[d]`` chunks per dim (the chunk
        rule), saved ``copies`` times (rank ``copy * cells + cell``), described in ``form``:
        ``boxes`` (each rank's boxes), or the peers' grid forms ``rank_offsets`` and ``grid``
        (Megatron's ``from_rank_offsets`` and ``axis_fragmentations``)."""
        if form != "boxes":
            raise self.unsupported(
                f"the peers' grid form {form!r} (Megatron's from_rank_offsets, "
                "axis_fragmentations): this implementation describes a layout by its boxes, "
                "which the 'boxes' form runs"
            )
        if copies > 1:
            raise self.unsupported(
                "saving replicas of a ShardedTensor box (torch's ShardedTensor holds each box "
                "once; replicated DTensors are loaded by test_checkpoint.py's round trips)"
            )
        from shardspec.metadata import Shard

        from .checkpoint_files import grid_entries

        shape = tuple(tensor.shape)
        # identical (empty) cells once: torch's ShardedTensor calls two of them an overlap
        # (validation-identical-empty-boxes-need-a-third); either holds nothing
        first: dict[Box, list[Any]] = {}
        for e in grid_entries(shape, parts, copies):
            first.setdefault(Box(e[1], e[2]), e)
        saved = Layout(shape, [Shard(b, e[0]) for b, e in first.items()])
        return self.checkpoint_round_trip(save_pool, load_pool, saved, tensor, load, example)

    def checkpoint_save_outcomes(
        self, pool: Any, saved: Layout, tensor: Any, path: str, example: str
    ) -> dict[int, str]:
        """Save ``saved`` (maybe invalid) of ``tensor`` to ``path`` on the pool's ranks with
        the implementation's own save: per rank ``returned``, ``raised T: message`` or
        ``still waiting in a collective ...`` (the pool restarted it)."""
        from conformance.codec import layout_to_json
        from shardspec.testing import RankError

        from .checkpoint_files import split_refusal

        args = {"path": path, "layout": layout_to_json(saved),
                "dtype": str(tensor.dtype).removeprefix("torch.")}  # fmt: skip
        inputs = [
            [tensor[b.slices()].contiguous() for b in saved.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        try:
            self._run_via("DCP save", pool, "checkpoint.save", args,
                          per_rank_tensors=inputs, example=example)  # fmt: skip
        except RankError as e:
            return split_refusal(e, pool.world_size)
        return dict.fromkeys(range(pool.world_size), "returned")

    def checkpoint_load_outcomes(
        self, pool: Any, path: str, layout: Layout, tensor: Any, example: str
    ) -> dict[int, str]:
        """Load the checkpoint at ``path`` (of ``tensor``, maybe damaged) into ``layout`` on
        the pool's ranks with the implementation's own load: per rank as
        :meth:`checkpoint_save_outcomes`."""
        import torch

        from conformance.codec import layout_to_json
        from shardspec.testing import RankError

        from .checkpoint_files import split_refusal

        args = {"kind": "sharded", "layout": layout_to_json(layout), "path": path,
                "dtype": str(tensor.dtype).removeprefix("torch."), "fill": 1,
                "shape": list(tensor.shape)}  # fmt: skip
        one = torch.ones((), dtype=tensor.dtype)
        inputs = [
            [one.expand(b.sizes).contiguous() for b in layout.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        try:
            self._run_via("DCP load", pool, "checkpoint.load", args,
                          per_rank_tensors=inputs, example=example)  # fmt: skip
        except RankError as e:
            return split_refusal(e, pool.world_size)
        return dict.fromkeys(range(pool.world_size), "returned")

    def peer_checkpoint(
        self, pool: Any, saved: Layout, tensor: Any, path: str, example: str
    ) -> None:
        """A peer's own save of ``saved`` to ``path``, in DCP's file format, for shardspec's
        tools to read (CKPT-21)."""
        raise self.unsupported(
            "a peer's checkpoint: this implementation writes DCP's own checkpoints, which "
            "test_checkpoint.py's round trips load"
        )

    # resharding (RESHARD-*)
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
        """Move ``tensor`` (global) from layout ``src`` to ``dst`` on the pool's ranks: each
        rank starts with its source boxes and returns a RankResult whose tensors are its
        destination boxes in ``dst``'s local order."""
        raise self.unsupported("resharding")

    def reshard_state_dict(
        self, pool: Any, entries: list[dict[str, Any]], budget: int | None, example: str
    ) -> list[Any]:
        """Move several tensors at once (``entries``: ``key``, ``src``, ``dst``, global
        ``tensor``, ``out`` kind of strategies_streams.OUT_KINDS or None, ``pad``) on the
        pool's ranks: per rank a RankResult whose tensors are its destination boxes of every
        entry in order, and whose ``value`` says per key whether the out= tensors given were
        returned (``same``) and whether anything outside them was written (``spilled``)."""
        raise self.unsupported("resharding a state dict of several dtypes")

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
        """The executor's collective checks (RESHARD-5, RESHARD-13): ``reshard`` of the one
        entry (``api`` ``reshard``) or ``reshard_state_dict`` of every entry (``key``,
        ``src``, ``dst``, global ``tensor``) with ``check_replicas``, where rank r passes
        ``copies[r][key]["src"/"dst"]`` instead of an entry's layouts, and as its source
        shards ``inputs[r]`` (every entry's boxes of r in order; by default the slices of the
        global tensors its own layouts give), strided when ``noncontig``; with ``out``, into
        out= tensors of its own destination boxes, filled with a sentinel byte. Per rank a
        RankResult: ``value["error"]`` (the ReshardError it raised, or None),
        ``value["untouched"]`` (whether its out= tensors still hold only the sentinel after
        an error; None without out=) and its destination shards of every entry when it
        returned."""
        raise self.unsupported(
            "the executor's collective checks before data moves (agreement, check_replicas)"
        )

    # TorchRec (TORCHREC-*, spec/08-torchrec.md)
    def torchrec_layout(
        self,
        sharding_type: str,
        shape: Sequence[int],
        world_size: int,
        local_size: int,
        params: dict[str, Any],
    ) -> Layout:
        """The layout of one ``(rows, cols)`` table under ``sharding_type`` with the plan helper's
        default block sizes, on ``world_size`` ranks of ``local_size`` per host. ``params`` are
        the helper's: ``rank`` (table_wise), ``ranks`` (column_wise, table_column_wise, with
        ``block_size`` for the latter), ``host_index`` (table_row_wise), ``host_indexes``
        (grid_shard). Raises ValueError when the implementation refuses the description."""
        raise self.unsupported("TorchRec layouts")

    def shards_wrapper(
        self, shards: Sequence[Any], offsets: Sequence[Sequence[int]]
    ) -> tuple[tuple[int, ...], list[Box]]:
        """(shape, DCP chunk boxes) of the implementation's LocalShardsWrapper holding
        ``shards`` at ``offsets``; raises ValueError (or AssertionError) when it refuses them."""
        raise self.unsupported("LocalShardsWrapper")

    def wrapper_object(self, shards: Sequence[Any], offsets: Sequence[Sequence[int]]) -> Any:
        """The implementation's LocalShardsWrapper itself, holding ``shards`` at ``offsets``
        (it has ``local_shards()``), for the ops a checkpoint load and an optimizer apply."""
        raise self.unsupported("LocalShardsWrapper")

    # converters on real ranks (CONVERT-*, DTENSOR-9) and FSDP's chunking (FSDP-6)
    def _run_via(self, what: str, pool: Any, op: str, args: dict[str, Any], **kw: Any) -> Any:
        if self.via is None:
            raise self.unsupported(what)
        if getattr(pool, "single_program", False) and self.via != "torch":
            raise self.unsupported(
                f"{what} on one program for every rank (LocalTensorMode): {self.via} computes "
                "each rank's boxes from its rank number in Python; its large worlds run on "
                "threaded ranks (nox -s conformance_scale)"
            )
        from shardspec.testing import RankError
        from shardspec.testing.local_tensor import SingleProgramError

        try:
            return list(pool.run(op, {**args, "via": self.via}, **kw))
        except SingleProgramError as e:
            raise self.unsupported(f"{what} beyond LocalTensorMode's one program: {e}") from None
        except RankError as e:
            # Every rank refused to convert (CONVERT-5): a layout no torch type can hold, not
            # a wrong answer. Any other failure, or a refusal on some ranks only, stands.
            refusals = [f for f in e.failures if f.type_name.endswith("ConversionError")]
            if refusals and len(refusals) == pool.world_size == len(e.failures):
                reason = e.failures[0].message
                raise self.unsupported(f"{what}: torch's types cannot hold it: {reason}") from None
            raise

    def sharded_tensor(
        self, pool: Any, layout: Layout, tensor: Any, example: str | None = None
    ) -> list[Any]:
        """A real ShardedTensor on the pool's ranks holding ``layout``'s boxes of ``tensor``:
        per rank, a RankResult with ``value["layout"]`` (its global metadata as layout JSON),
        ``value["local"]`` (its local shards' boxes) and the local shards' data."""
        inputs = [
            [tensor[b.slices()].contiguous() for b in layout.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        from conformance.codec import layout_to_json

        args = {"layout": layout_to_json(layout), "dtype": str(tensor.dtype).removeprefix("torch.")}
        return self._run_via(  # type: ignore[no-any-return]
            "ShardedTensor from a layout",
            pool,
            "convert.sharded_tensor",
            args,
            per_rank_tensors=inputs,
            example=example,
        )

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

    def fsdp_chunk_tensor(self, pool: Any, tensor: Any, example: str) -> list[Any]:
        """FSDP's ShardedTensor of a plain tensor's dim-0 chunks over the pool's ranks: per
        rank ``value["layout"]``, ``value["local"]`` and the local data."""
        return self._run_via(  # type: ignore[no-any-return]
            "FSDP chunking",
            pool,
            "fsdp.chunk_sharded_tensor",
            {},
            tensors=[tensor],
            example=example,
        )

    def flatten(
        self,
        pool: Any,
        mesh: Sequence[int],
        tp_dim: int,
        weight: Any,
        buf: Any,
        owners: Sequence[int],
        example: str,
    ) -> list[Any]:
        """FSDP-8 on a ``(dp, tp)`` mesh of the pool's ranks: a state dict whose ``layer.w`` is
        the implementation's FSDP1 ``chunk_tensor`` of ``weight`` TP-sharded on ``tp_dim``
        (nested ShardedTensors), ``layer.n`` a plain value and ``buf`` a ShardedTensor of
        ``buf``'s dim-0 chunks on ``owners`` only, flattened by the implementation. Per rank
        ``value["keys"]`` (the keys kept), ``value["entries"][key]`` (``layout`` JSON and
        ``local`` boxes of each ShardedTensor kept) and the local data, entries in key order."""
        args = {"mesh": list(mesh), "tp_dim": tp_dim, "owners": list(owners)}
        # The first example on a pool builds a 2-D mesh and its sub-groups, which on a loaded
        # machine takes longer than the per-example default; a hang is still caught.
        timeout = max(60.0, float(getattr(pool, "timeout", 0.0) or 0.0))
        return self._run_via(  # type: ignore[no-any-return]
            "flattening nested ShardedTensors",
            pool,
            "fsdp.flatten",
            args,
            tensors=[weight, buf],
            example=example,
            timeout=timeout,
        )

    def fsdp_chunk_dtensor(self, pool: Any, tensor: Any, example: str) -> list[Any]:
        """FSDP1 + TP's chunk hook on a DTensor ``Shard(0)`` over every rank (FSDP over each
        rank alone): per rank ``value["outer"]`` / ``["inner"]`` layouts, ``["outer_local"]``,
        ``["inner_local"]`` and the inner local data."""
        return self._run_via(  # type: ignore[no-any-return]
            "FSDP + TP chunking", pool, "fsdp.chunk_dtensor", {}, tensors=[tensor], example=example
        )


def _damage(path: str, how: str) -> str:
    """Spoil the checkpoint at ``path`` as :meth:`Impl.checkpoint_collective_load` says;
    returns the file's name."""
    import os
    import pickle

    meta = os.path.join(path, ".metadata")
    if how == "metadata":
        with open(meta, "wb") as f:
            f.write(b"not a pickle")
        return ".metadata"
    with open(meta, "rb") as f:
        md = pickle.load(f)  # written by this run's own dcp.save: trusted
    if how in ("gap", "overlap"):
        _spoil_chunk_list(md, how)
        with open(meta, "wb") as f:
            pickle.dump(md, f)
        return ".metadata"
    # the file holding t's largest chunk (or v's, when t holds nothing)
    best: tuple[int, str, int, int] | None = None
    for index, info in md.storage_data.items():
        smd = md.state_dict_metadata[index.fqn]
        chunks = getattr(smd, "chunks", None)
        numel = 0  # a value: every rank loads it
        if chunks is not None:  # a chunk of t: an empty one is never read
            numel = -1
            for c in chunks:
                if list(c.offsets) == list(index.offset or []) and c.sizes.numel():
                    numel = int(c.sizes.numel())
        if best is None or numel > best[0]:
            best = (numel, info.relative_path, info.offset, info.length)
    assert best is not None
    _, rel, offset, length = best
    name = os.path.join(path, rel)
    if how == "remove":
        os.remove(name)
    elif how == "truncate":
        os.truncate(name, offset + length // 2)
    else:
        raise ValueError(f"damage must be metadata, remove, truncate, gap or overlap, got {how!r}")
    return rel


def _spoil_chunk_list(md: Any, how: str) -> None:
    """Spoil the chunk list of ``t`` in ``md`` (a valid one, of a non-empty tensor) in place
    as :func:`_damage` says, the stored bytes left as they are: each chunk that stays still
    finds bytes of its own size, so only the chunk check (CKPT-1) can tell."""
    import dataclasses

    import torch

    smd = md.state_dict_metadata["t"]
    shape = list(smd.size)
    stored = [k for k in md.storage_data if k.fqn == "t"]
    chunks = sorted((c for c in smd.chunks if c.sizes.numel()), key=lambda c: -int(c.sizes.numel()))
    if not chunks:
        raise ValueError("a gap or an overlap needs a tensor with a non-empty chunk")
    if how == "overlap":
        # the chunks tile the tensor, so a chunk that stops short of the tensor's end in a
        # dim, moved one element along it, covers an element of another chunk
        for c in chunks:
            for d, (o, n) in enumerate(zip(c.offsets, c.sizes)):
                if o + n < shape[d]:
                    key = next(k for k in stored if list(k.offset) == list(c.offsets))
                    c.offsets = torch.Size([o + (k == d) for k, o in enumerate(c.offsets)])
                    moved = dataclasses.replace(key, offset=c.offsets)
                    md.storage_data[moved] = md.storage_data.pop(key)
                    return
    # no chunk can move (one holds the whole tensor), or a gap asked for: the largest goes
    smd.chunks.remove(chunks[0])
    key = next(k for k in stored if list(k.offset) == list(chunks[0].offsets))
    del md.storage_data[key]


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _ones_of(load: dict[str, Any], tensor: Any, world: int) -> list[list[Any]]:
    """Per rank, the local tensors a load into ``load`` starts from: ones, one per box of a
    ShardedTensor destination (the other kinds build their own)."""
    import torch

    from conformance.codec import layout_from_json

    if load["kind"] != "sharded":
        return [[] for _ in range(world)]
    dst = layout_from_json(load["layout"])
    ones = torch.ones((), dtype=tensor.dtype)
    return [[ones.expand(b.sizes).contiguous() for b in dst.boxes_of(r)] for r in range(world)]
