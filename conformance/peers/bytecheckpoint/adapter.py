"""ByteCheckpoint 0.0.2 (``bytecheckpoint``) under test: ``SHARDSPEC_IMPL=bytecheckpoint``, in
the venv ``nox -s peers_bytecheckpoint`` builds (torch 2.13.0 CPU, ByteCheckpoint installed
``--no-deps``: it pins ``torch<=2.5.0``).

ByteCheckpoint is a checkpoint library: its API saves and loads FSDP, FSDP2 and DDP state
dicts (``bytecheckpoint.save`` / ``load`` with a framework name). So it answers the
checkpoint questions: a drawn ShardedTensor layout saved on one world and loaded on another as
a ShardedTensor or a DTensor (``checkpoint_round_trip``), the FSDP area's uneven model with its
Adam state saved on one mesh and loaded on another (``checkpoint_model_round_trip``), damaged
checkpoints (``checkpoint_damaged_load``), extra state, its torch release check, and the files
our tools must read (``checkpoint_written``). Everything else (validation, the chunk rule,
DTensor, specs, converters, resharding, FSDP's state-dict hooks, TorchRec, DCP load planners)
is no part of its API and is reported unsupported with that reason. Its rank code is
``conformance/peers/bytecheckpoint/ops.py``; every save is held to loopback
(``conformance/peers/bytecheckpoint/env.py``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from conformance.codec import layout_to_json
from conformance.interface import CheckpointFiles, CheckpointLibrary, Unsupported
from conformance.interface.worlds import raise_failed, world_outcomes
from shardspec.metadata import Layout

__all__ = ["ByteCheckpointImpl"]

WHAT_IT_IS = (
    "ByteCheckpoint 0.0.2 is a checkpoint library (bytecheckpoint.save/load of FSDP, FSDP2 "
    "and DDP state dicts, its own planner, files and coordinator); its API has no"
)
COMMITTED = (
    Path(__file__).resolve().parents[3]
    / "packages/checkpoint/tests/data/bytecheckpoint-0.0.2-fsdp2-uneven"
)
# A world function's limit: a fresh gloo world, a model and a save or load.
WORLD_TIMEOUT = 180.0
# Once a rank has raised, how long the others get to finish (run_world's own default): after
# two worlds in which no rank answered, world_outcomes fails further ones at once, so a stuck
# runtime costs two timeouts, not one per example.
ERROR_GRACE = 30.0
# A load whose other ranks wait in ByteCheckpoint's barrier for a rank that failed: how long
# the pool waits for them before calling them left waiting.
DAMAGED_TIMEOUT = 20.0


class ByteCheckpointImpl(CheckpointFiles, CheckpointLibrary):
    name = "bytecheckpoint"
    # imported by the pools only while ByteCheckpoint is under test (its own venv)
    rank_ops = ("conformance.peers.bytecheckpoint.ops",)
    via = None  # no converters: DTensor, ShardedTensor and FSDP helpers are torch's

    def __init__(self) -> None:
        self._model_runs: dict[str, dict[str, dict[int, list[str]]]] = {}

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("bytecheckpoint")
        except PackageNotFoundError:
            return "bytecheckpoint not installed"

    def unsupported(self, what: str) -> Unsupported:
        return Unsupported(f"unsupported by {self.name}: {WHAT_IT_IS} {what}")

    # --- the drawn round trips (test_checkpoint.py) -----------------------------------------

    def checkpoint_round_trip(
        self,
        save_pool: Any,
        load_pool: Any,
        saved: Layout,
        tensor: Any,
        load: dict[str, Any],
        example: str,
    ) -> list[Any]:
        import torch

        from conformance.codec import layout_from_json

        dtype = str(tensor.dtype).removeprefix("torch.")
        with tempfile.TemporaryDirectory(prefix="shardspec-bcp-") as path:
            self._save(save_pool, saved, tensor, path, example)
            args = {"kind": load["kind"], "path": path, "dtype": dtype, "fill": 1,
                    "shape": list(tensor.shape), "via": "shardspec"}  # fmt: skip
            per_rank: list[list[Any]] = [[] for _ in range(load_pool.world_size)]
            if load["kind"] == "sharded":
                args["layout"] = load["layout"]
                dst = layout_from_json(load["layout"])
                ones = torch.ones((), dtype=tensor.dtype)
                per_rank = [
                    [ones.expand(b.sizes).contiguous() for b in dst.boxes_of(r)]
                    for r in range(load_pool.world_size)
                ]
            else:
                args["mesh"], args["placements"] = load["mesh"], load["placements"]
            return self._run(
                load_pool, "bytecheckpoint.load", args, per_rank_tensors=per_rank, example=example
            )

    def _save(self, pool: Any, layout: Layout, tensor: Any, path: str, example: str) -> None:
        dtype = str(tensor.dtype).removeprefix("torch.")
        inputs = [
            [tensor[b.slices()].contiguous() for b in layout.boxes_of(r)]
            for r in range(pool.world_size)
        ]
        args = {"path": path, "layout": layout_to_json(layout), "dtype": dtype, "via": "shardspec"}
        results = self._run(
            pool, "bytecheckpoint.save", args, per_rank_tensors=inputs, example=example
        )
        wide = {r.rank: r.value["listening"] for r in results if r.value["listening"]}
        assert not wide, f"listening beyond loopback during the save: {wide} [{example}]"

    def _run(self, pool: Any, op: str, args: dict[str, Any], **kw: Any) -> list[Any]:
        from shardspec.testing.simulated import SimulatedPool

        if getattr(pool, "single_program", False) or isinstance(pool, SimulatedPool):
            raise self.unsupported(
                "threaded or one-program ranks: its saves start a coordinator per process and "
                "write files per process rank"
            )
        from shardspec.testing import RankError

        try:
            return list(pool.run(op, args, **kw))
        except RankError as e:
            # The ShardedTensor the harness builds (torch's types, not ByteCheckpoint's)
            # cannot hold the layout on any rank: CONVERT-5, not a ByteCheckpoint answer.
            refusals = [f for f in e.failures if f.type_name.endswith("ConversionError")]
            if refusals and len(refusals) == pool.world_size == len(e.failures):
                raise Unsupported(
                    f"unsupported by {self.name}: torch's ShardedTensor cannot hold the layout "
                    f"it would save: {refusals[0].message}"
                ) from None
            raise

    # --- our tools on what it writes (CKPT-19) ------------------------------------------------

    def checkpoint_written(self, pool: Any, layout: Layout, tensor: Any, path: str, ex: str) -> str:
        self._save(pool, layout, tensor, path, ex)
        return str(Path(path) / "model")

    # --- its own checkpoints of models, damaged ones, extra state (CKPT-20) -------------------

    def checkpoint_model_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, dict[int, list[str]]]:
        key = repr((save, load))
        if key not in self._model_runs:  # several tests ask about one run
            self._model_runs[key] = self._model_round_trip(save, load, example)
        return self._model_runs[key]

    def _model_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, dict[int, list[str]]]:
        ops = "conformance.peers.bytecheckpoint.ops"
        with tempfile.TemporaryDirectory(prefix="shardspec-bcp-model-") as path:
            saved = world_outcomes(
                f"{ops}:model_save_world", _world(save["mesh"]), path, save["kind"],
                save["mesh"], timeout=WORLD_TIMEOUT, error_grace=ERROR_GRACE,
            )  # fmt: skip
            raise_failed("save", saved, example)
            wide = {r: v["listening"] for r, (_, v) in saved.items() if v["listening"]}
            assert not wide, f"listening beyond loopback during the save: {wide} [{example}]"
            values = saved[0][1]["saved"]
            loaded = world_outcomes(
                f"{ops}:model_load_world", _world(load["mesh"]), path, load["kind"],
                load["mesh"], values, timeout=WORLD_TIMEOUT, error_grace=ERROR_GRACE,
            )  # fmt: skip
            raise_failed("load", loaded, example)
            return {
                "save": {r: list(v["changed"]) for r, (_, v) in saved.items()},
                "load": {r: list(v) for r, (_, v) in loaded.items()},
            }

    def checkpoint_damaged_load(
        self, save_pool: Any, load_pool: Any, damage: str, example: str
    ) -> dict[int, str]:
        import torch

        from conformance.peers.bytecheckpoint.ops import damage as do_damage
        from shardspec.metadata import chunk_layout
        from shardspec.testing import RankCrash, RankError

        t = torch.arange(7, dtype=torch.float32)
        saved = chunk_layout((7,), 0, list(range(save_pool.world_size)))
        with tempfile.TemporaryDirectory(prefix="shardspec-bcp-damaged-") as path:
            self._save(save_pool, saved, t, path, example)
            do_damage(path, damage)
            args = {
                "kind": "dtensor",
                "path": path,
                "dtype": "float32",
                "fill": 1,
                "shape": [7],
                "mesh": [load_pool.world_size],
                "placements": [["S", 0]],
                "via": "shardspec",
            }
            timeout = max(DAMAGED_TIMEOUT, float(getattr(load_pool, "timeout", 0.0) or 0.0))
            try:
                load_pool.run("bytecheckpoint.load", args, example=example, timeout=timeout)
            except RankError as e:
                out = dict.fromkeys(range(load_pool.world_size), "left waiting")
                for f in e.failures:
                    out[f.rank] = f"refused: {f.type_name}: {f.message}"[:300]
                return out
            except RankCrash:
                return dict.fromkeys(range(load_pool.world_size), "left waiting")
            return dict.fromkeys(range(load_pool.world_size), "loaded")

    def checkpoint_extra_state(self, example: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="shardspec-bcp-extra-") as path:
            res = world_outcomes(
                "conformance.peers.bytecheckpoint.ops:extra_state_world",
                1,
                path,
                timeout=WORLD_TIMEOUT,
                error_grace=ERROR_GRACE,
            )
        raise_failed("extra state", res, example)
        return dict(res[0][1])

    def write_test_checkpoint(self, out: str) -> tuple[str, str]:
        from conformance.peers.bytecheckpoint.data import generate

        generate(out, timeout=WORLD_TIMEOUT)
        return out, str(COMMITTED)

    def checkpoint_accepts_torch(self, release: str) -> bool:
        from conformance.peers.bytecheckpoint.ops import version_check

        return version_check(release) is None


def _world(mesh: list[int]) -> int:
    n = 1
    for m in mesh:
        n *= m
    return n
