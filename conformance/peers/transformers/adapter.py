"""transformers 5.23.0 (``transformers``) under test: ``SHARDSPEC_IMPL=transformers``, in the
venv ``nox -s peers_transformers`` builds (torch 2.13.0 CPU, transformers and accelerate pinned).

transformers is a model library: what the suite asks it is how its distributed loading lays a
safetensors model out over ranks (the hf_model area): a Llama-style model loaded with
``from_pretrained(..., distributed_config=DistributedConfig(tp_size, fsdp_size))`` on gloo CPU
ranks, each rank's shard compared with its placements' slice of the file's tensor, and saved
with ``save_pretrained`` (its distributed checkpoint, or consolidated safetensors) and loaded
on another mesh. Everything else is no part of its API and is reported unsupported with that
reason. Its rank code is ``conformance/peers/transformers/worlds.py``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from conformance.interface import HfModel, Unsupported
from conformance.interface.worlds import raise_failed, world_outcomes

__all__ = ["TransformersImpl"]

WHAT_IT_IS = (
    "transformers 5.23.0 is a model library (from_pretrained and save_pretrained with a "
    "DistributedConfig); its API has no"
)
WORLDS = "conformance.peers.transformers.worlds"
# A world function's limit: a fresh gloo world importing transformers, a load and a save.
WORLD_TIMEOUT = 240.0
ERROR_GRACE = 10.0


class TransformersImpl(HfModel):
    name = "transformers"
    rank_ops = ()  # its ranks run world functions (fresh worlds), not the pool's operations
    via = None

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("transformers")
        except PackageNotFoundError:
            return "transformers not installed"

    def unsupported(self, what: str) -> Unsupported:
        return Unsupported(f"unsupported by {self.name}: {WHAT_IT_IS} {what}")

    def hf_load(
        self, model: dict[str, Any], mesh: dict[str, int], example: str
    ) -> dict[int, dict[str, dict[str, Any]]]:
        with tempfile.TemporaryDirectory(prefix="shardspec-transformers-") as path:
            _write(path, model)
            got = _world(f"{WORLDS}:load_world", mesh, path, mesh["tp"], mesh["fsdp"])
            raise_failed("load", got, example)
        return {r: v for r, (_, v) in got.items()}

    def hf_save_shardspec_load(
        self,
        model: dict[str, Any],
        save_mesh: dict[str, int],
        fmt: str,
        load_mesh: dict[str, int],
        example: str,
    ) -> dict[int, dict[str, dict[str, Any]]]:
        with tempfile.TemporaryDirectory(prefix="shardspec-transformers-") as path:
            _write(path, model)
            out = os.path.join(path, "saved")
            saved = _world(
                f"{WORLDS}:save_world", save_mesh, path, save_mesh["tp"], save_mesh["fsdp"],
                fmt, out,
            )  # fmt: skip
            raise_failed(f"save ({fmt})", saved, example)
            got = _world(
                f"{WORLDS}:shardspec_load_world", load_mesh, path, load_mesh["tp"],
                load_mesh["fsdp"], out,
            )  # fmt: skip
            raise_failed(f"shardspec's load of the {fmt} save", got, example)
        return {r: v for r, (_, v) in got.items()}

    def hf_save_load_pairs(
        self, model: dict[str, Any], meshes: list[dict[str, int]], example: str
    ) -> dict[str, Any]:
        # A world a mesh saves in both formats, and a world a mesh loads every save in turn:
        # 2 x len(meshes) worlds for every pair, where a world a pair would take 4 x as long.
        out: dict[str, Any] = {"saved": {}, "loaded": {}, "chunks": {}}
        with tempfile.TemporaryDirectory(prefix="shardspec-transformers-") as path:
            _write(path, model)
            saves: list[tuple[int, str, str]] = []
            for i, m in enumerate(meshes):
                dcp, st = os.path.join(path, f"dcp-{i}"), os.path.join(path, f"st-{i}")
                got = _world(f"{WORLDS}:save_both_world", m, path, m["tp"], m["fsdp"], dcp, st)
                raise_failed(f"save on {_mesh(m)}", got, example)
                out["saved"][i] = {r: v for r, (_, v) in got.items()}
                out["chunks"][i] = _chunks(dcp)
                saves += [(i, "dcp", dcp), (i, "safetensors", st)]
            for j, m in enumerate(meshes):
                paths = [p for _, _, p in saves]
                got = _world(f"{WORLDS}:load_many_world", m, paths, m["tp"], m["fsdp"])
                raise_failed(f"loads on {_mesh(m)}", got, example)
                for k, (i, fmt, _) in enumerate(saves):
                    out["loaded"][(i, fmt, j)] = {r: v[k] for r, (_, v) in got.items()}
        return out

    def hf_optimizer_round_trip(
        self,
        model: dict[str, Any],
        moments: dict[str, Any],
        save_mesh: dict[str, int],
        load_mesh: dict[str, int],
        example: str,
    ) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="shardspec-transformers-") as path:
            _write(path, model)
            out = os.path.join(path, "optimizer")
            s, d = save_mesh, load_mesh
            saved = _world(
                f"{WORLDS}:optimizer_save_world", s, path, s["tp"], s["fsdp"], moments, out
            )
            raise_failed(f"optimizer save on {_mesh(s)}", saved, example)
            got = _world(f"{WORLDS}:optimizer_load_world", d, path, d["tp"], d["fsdp"], out)
            raise_failed(f"optimizer load on {_mesh(d)}", got, example)
        return {
            "saved": {r: v for r, (_, v) in saved.items()},
            "loaded": {r: v for r, (_, v) in got.items()},
        }


def _mesh(m: dict[str, int]) -> str:
    return f"tp {m['tp']} x fsdp {m['fsdp']}"


def _chunks(path: str) -> dict[str, list[tuple[list[int], Any]]]:
    """Each tensor's pieces in a distributed checkpoint's files, at the offsets each file's
    ``DCP_SHARDING_INFO`` records (read with safetensors itself, not shardspec's reader)."""
    import json

    from safetensors import safe_open

    out: dict[str, list[tuple[list[int], Any]]] = {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, name), framework="pt") as f:
            info = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                offsets = info.get(key, {}).get("saved_offsets")
                out.setdefault(key, []).append((offsets, f.get_tensor(key)))
    return out


def _write(path: str, model: dict[str, Any]) -> None:
    from conformance.peers.transformers.worlds import write_model

    write_model(path, model["config"], model["weights"])


def _world(fn: str, mesh: dict[str, int], *args: Any) -> dict[int, tuple[str, Any]]:
    world = mesh["tp"] * mesh["fsdp"]
    return world_outcomes(fn, world, *args, timeout=WORLD_TIMEOUT, error_grace=ERROR_GRACE)
