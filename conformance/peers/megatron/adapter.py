"""The adapter for Megatron-Core's ``dist_checkpointing`` (a peer: ``nox -s peers_megatron``).

What Megatron answers is checkpoints: a real ``dist_checkpointing.save`` (``torch_dist``
backend) on one pool's ranks and ``dist_checkpointing.load`` on another's, compared with the
reference bit for bit (``conformance/peers/megatron/ops.py`` runs them). A layout becomes Megatron
``ShardedTensor`` objects, one per box: the box form (``axis_fragmentations=None``, Megatron's
form for uneven splits) for any layout, and, for the grids of
``test_checkpoint_files.py``, the two grid forms (``from_rank_offsets``, or the constructor
with ``axis_fragmentations``). Identical boxes on several ranks are replicas, told apart by
``replica_id`` (0, the main replica, on the lowest rank). A DTensor load target becomes each
rank's box of it.

Refit (``megatron.core.resharding``, Megatron's weight transfer between two Megatron models):
the case's layouts become each rank's ``ParameterMetadata`` (``rosters.py``), and
``refit_ops.py`` plans with ``build_plan_from_rosters`` and executes the plan with the gloo
copy service, round after round; what Megatron cannot say (packing separate tensors, padding,
stacking, casts, FP8 blocks, uneven or empty TP chunks) is unsupported, with the reason.

Everything else of the spec (layouts, chunking, DTensor, resharding, FSDP, TorchRec, load
planning on an in-memory checkpoint) is not what Megatron does: those cases are unsupported,
each with the reason (CONF-4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from conformance.interface import Checkpoint, CheckpointFiles, Refit
from conformance.interface.checkpoint_files import describe_split, grid_entries, split_refusal
from shardspec.metadata import Box, Layout

__all__ = ["MegatronImpl", "dtensor_entries", "entries_of"]

# Why each area of the spec is unsupported: Megatron's dist_checkpointing saves and loads a
# state dict of its own ShardedTensors; it has no API for the rest.
NOT_CHECKPOINTING = (
    "Megatron-Core's dist_checkpointing saves and loads checkpoints of its own ShardedTensors "
    "(its sharding is described per rank and checked only when saved); it has no API for this"
)


def entries_of(layout: Layout) -> list[list[Any]]:
    """``[rank, offsets, sizes, replica_id, cell]`` per shard of ``layout``, in its order:
    a box held by several ranks is a replica, ``replica_id`` counting its holders in order. A
    box twice on one rank is that rank's one copy stated twice (the same replica_id), not a
    replica: a layout the save must refuse (CKPT-4), asked of Megatron as such."""
    holders: dict[Box, list[int]] = {}
    out: list[list[Any]] = []
    for s in layout.shards:
        ranks = holders.setdefault(s.box, [])
        if s.rank not in ranks:
            ranks.append(s.rank)
        replica = ranks.index(s.rank)
        out.append([s.rank, list(s.box.offsets), list(s.box.sizes), replica, [0] * s.box.ndim])
    return out


def dtensor_entries(shape: Sequence[int], mesh: Sequence[int], placements: Any) -> list[list[Any]]:
    """Each rank's box of a DTensor on ``mesh`` with ``Shard``/``Replicate`` ``placements``
    (the reference's indices, one contiguous run per dim), replicas numbered in rank order."""
    from conformance import reference

    boxes = []
    for r, coord in enumerate(reference.mesh_coordinates(mesh)):
        idx = reference.dtensor_indices(shape, mesh, placements, coord)
        if any(ix != list(range(ix[0], ix[0] + len(ix))) for ix in idx if ix):
            raise ValueError(f"rank {r}'s DTensor piece is not one box: {idx}")
        offsets = [ix[0] if ix else n for ix, n in zip(idx, shape)]
        boxes.append((r, Box(offsets, [len(ix) for ix in idx])))
    seen: Counter[Box] = Counter()
    out: list[list[Any]] = []
    for r, b in boxes:
        out.append([r, list(b.offsets), list(b.sizes), seen[b], [0] * b.ndim])
        seen[b] += 1
    return out


class MegatronImpl(Checkpoint, CheckpointFiles, Refit):
    name = "megatron"
    # imported by the pools only while Megatron-Core is under test (its own venv)
    rank_ops = ("conformance.peers.megatron.ops", "conformance.peers.megatron.refit_ops")

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("megatron-core")
        except PackageNotFoundError:
            return "megatron-core not installed"

    def unsupported(self, what: str) -> Any:
        from conformance.interface import Unsupported

        if what.startswith(("saving ", "loading ", "the grid form", "a ", "planning ", "refit")):
            return Unsupported(f"unsupported by {self.name}: {what}")
        return Unsupported(f"unsupported by {self.name}: {what} ({NOT_CHECKPOINTING})")

    def checkpoint_accepts(self, shape: Sequence[int], chunks: Sequence[Box]) -> bool:
        raise self.unsupported(
            "a check of a saved tensor's chunks: Megatron's load reads whatever the metadata "
            "lists (its gaps and overlaps show in the round trips and the damaged loads)"
        )

    def checkpoint_load(self, shape: Sequence[int], chunks: Sequence[Box], tensor: Any) -> Any:
        raise self.unsupported(
            "a load planner on an in-memory checkpoint: MCoreLoadPlanner plans for Megatron's "
            "own ShardedTensor wrappers, which only dist_checkpointing.load builds (its loads "
            "run end to end in the round trips)"
        )

    def checkpoint_reads(self, shape: Sequence[int], saved: Any, local: Any) -> Any:
        raise self.unsupported(
            "planning reads alone: Megatron plans with DCP's default planner inside its load "
            "(its loads run end to end in the round trips)"
        )

    def _run(self, pool: Any, op: str, args: dict[str, Any], inputs: Any, example: str) -> Any:
        """``pool.run`` of a Megatron operation. When some ranks raised and the others did not
        (they returned, or were still waiting in a collective when the pool restarted them),
        the error's first line says what each rank did."""
        from shardspec.testing import RankError

        try:
            return pool.run(op, args, per_rank_tensors=inputs, example=example, timeout=60.0)
        except RankError as e:
            outcomes = split_refusal(e, pool.world_size)
            if all(v.startswith("raised") for v in outcomes.values()):
                raise
            raise RankError(f"{op}: {describe_split(outcomes)}\n{e}", e.failures) from None

    def save(
        self,
        pool: Any,
        path: str,
        shape: Sequence[int],
        entries: list[list[Any]],
        tensor: Any,
        example: str,
        *,
        form: str = "boxes",
        parts: Sequence[int] = (),
    ) -> list[Any]:
        """``dist_checkpointing.save`` on the pool's ranks of ``tensor``'s entries."""
        dtype = str(tensor.dtype).removeprefix("torch.")
        args = {"path": path, "shape": list(shape), "entries": entries, "dtype": dtype,
                "form": form, "parts": list(parts)}  # fmt: skip
        inputs = [
            [tensor[Box(e[1], e[2]).slices()].contiguous() for e in entries if e[0] == r]
            for r in range(pool.world_size)
        ]
        return self._run(pool, "megatron.save", args, inputs, example)  # type: ignore[no-any-return]

    def load(
        self,
        pool: Any,
        path: str,
        shape: Sequence[int],
        entries: list[list[Any]],
        tensor: Any,
        example: str,
    ) -> list[Any]:
        """``dist_checkpointing.load`` on the pool's ranks into the entries, each filled with
        ones beforehand; per rank a RankResult with the loaded tensors, in entry order."""
        import torch

        args = {"path": path, "shape": list(shape), "entries": entries, "form": "boxes",
                "parts": []}  # fmt: skip
        one = torch.ones((), dtype=tensor.dtype)
        inputs = [
            [one.expand(e[2]).contiguous() for e in entries if e[0] == r]
            for r in range(pool.world_size)
        ]
        return self._run(pool, "megatron.load", args, inputs, example)  # type: ignore[no-any-return]

    def _load_entries(self, load: dict[str, Any], shape: Sequence[int]) -> list[list[Any]]:
        from conformance.codec import layout_from_json

        if load["kind"] == "sharded":
            return entries_of(layout_from_json(load["layout"]))
        try:
            return dtensor_entries(shape, load["mesh"], load["placements"])
        except ValueError as e:
            raise self.unsupported(f"loading into {e}: Megatron loads boxes") from None

    def checkpoint_round_trip(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        example: str,
    ) -> list[Any]:
        """Saved in the box form; a DTensor target is loaded as each rank's box of it."""
        import tempfile

        shape = tuple(tensor.shape)
        dst = self._load_entries(load, shape)
        with tempfile.TemporaryDirectory(prefix="shardspec-megatron-") as path:
            self.save(save_pool, path, shape, entries_of(saved), tensor, example)
            return self.load(load_pool, path, shape, dst, tensor, example)

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
        import tempfile

        shape = tuple(tensor.shape)
        entries = grid_entries(shape, parts, copies)
        if form == "rank_offsets" and any(0 in e[2] for e in entries):
            raise self.unsupported(
                "the grid form from_rank_offsets with an empty cell: it derives the global "
                "shape from the local one (parts x local size), which an empty cell cannot give"
            )
        dst = self._load_entries(load, shape)
        with tempfile.TemporaryDirectory(prefix="shardspec-megatron-") as path:
            self.save(save_pool, path, shape, entries, tensor, example, form=form, parts=parts)
            return self.load(load_pool, path, shape, dst, tensor, example)

    def checkpoint_save_outcomes(
        self, pool: Any, saved: Layout, tensor: Any, path: str, example: str
    ) -> dict[int, str]:
        from shardspec.testing import RankError

        if not saved.shards:
            # Megatron knows a tensor only through the ShardedTensors of its pieces: a layout
            # in which no rank holds one (not even an empty one) is no save at all.
            raise self.unsupported(
                "a save of a tensor no rank holds a piece of: Megatron's save has no means to "
                "state its shape"
            )
        try:
            self.save(pool, path, tuple(tensor.shape), entries_of(saved), tensor, example)
        except RankError as e:
            return split_refusal(e, pool.world_size)
        return dict.fromkeys(range(pool.world_size), "returned")

    def checkpoint_load_outcomes(
        self, pool: Any, path: str, layout: Layout, tensor: Any, example: str
    ) -> dict[int, str]:
        from shardspec.testing import RankError

        try:
            self.load(pool, path, tuple(tensor.shape), entries_of(layout), tensor, example)
        except RankError as e:
            return split_refusal(e, pool.world_size)
        return dict.fromkeys(range(pool.world_size), "returned")

    def peer_checkpoint(
        self, pool: Any, saved: Layout, tensor: Any, path: str, example: str
    ) -> None:
        self.save(pool, path, tuple(tensor.shape), entries_of(saved), tensor, example)

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
        """``megatron.core.resharding`` on the pool's ranks (``refit_ops.py``): each rank's
        metadata from the layouts, Megatron's plan, its gloo copy service, once per round."""
        from conformance.peers.megatron.rosters import Inexpressible, rosters

        dtypes = {n: str(t.dtype).removeprefix("torch.") for n, t in rounds[0].items()}
        try:
            meta = rosters(recipe, src, dst, dtypes, pool.world_size)
        except Inexpressible as e:
            raise self.unsupported(f"refit where {e}") from None
        boxes, inputs = [], []
        for r, mine in enumerate(meta):
            names = list(dict.fromkeys(m["name"] for m in mine["src"]))
            boxes.append({n: len(src[n].boxes_of(r)) for n in names})
            inputs.append([full[n][b.slices()].contiguous() for full in rounds for n in names
                           for b in src[n].boxes_of(r)])  # fmt: skip
        args = {"metadata": meta, "boxes": boxes, "rounds": len(rounds)}
        answers = []
        for res in self._run(pool, "megatron.refit", args, inputs, example):
            it = iter(res.tensors)
            per_round = []
            for _ in rounds:
                got: dict[str, list[Any]] = {}
                for m in meta[res.rank]["dst"]:
                    got[m["name"]] = [next(it) for _ in range(max(1, len(m["pieces"])))]
                per_round.append(got)
            answers.append(per_round)
        return answers

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
        raise self.unsupported(
            "refit's refusals (REFIT-12): they pass shardspec.refit's arguments wrong (a source "
            "box, a destination layout, the recipe); Megatron's refit reads each rank's "
            "metadata off its two models, which have no such arguments"
        )
