"""DeepSpeed 0.19.8 (``deepspeed``) under test: ``SHARDSPEC_IMPL=deepspeed``, in the venv ``nox -s
peers_deepspeed`` builds (torch 2.13.0 CPU; DeepSpeed from its source release with no op
compiled, ``DS_BUILD_OPS=0``; run with ``DS_ACCELERATOR=cpu`` on gloo).

DeepSpeed is a trainer: what the suite asks it is what its ZeRO checkpoints hold and give back
(the zero_checkpoint area, FLAT-6..8): a model saved under ZeRO stage 1, 2 or 3 on one
data-parallel size, converted by ``ds_to_universal`` and loaded with ``load_universal`` on
another size and stage, and read offline by ``zero_to_fp32``. Everything else (layouts,
DTensor, DCP, resharding, FSDP, TorchRec) is no part of its API and is reported unsupported with
that reason. Its rank code is ``conformance/peers/deepspeed/worlds.py``.
"""

from __future__ import annotations

import tempfile
from typing import Any

from conformance.interface import Unsupported, ZeroCheckpoint
from conformance.interface.worlds import raise_failed, world_outcomes

__all__ = ["DeepSpeedImpl"]

WHAT_IT_IS = (
    "DeepSpeed 0.19.8 is a trainer (ZeRO engines, their checkpoints, ds_to_universal and "
    "zero_to_fp32); its API has no"
)
# A world function's limit: a fresh gloo world, a ZeRO engine, a step and a save or load.
WORLD_TIMEOUT = 240.0
WORLDS = "conformance.peers.deepspeed.worlds"
# A rank that raised in a load leaves the others in DeepSpeed's next collective, which never
# ends: how long they get before they are called left waiting (not the pool's 30 s).
ERROR_GRACE = 5.0


class DeepSpeedImpl(ZeroCheckpoint):
    name = "deepspeed"
    rank_ops = ()  # its ranks run world functions (fresh worlds), not the pool's operations
    via = None

    def __init__(self) -> None:
        self._runs: dict[str, dict[str, Any]] = {}

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("deepspeed")
        except PackageNotFoundError:
            return "deepspeed not installed"

    def unsupported(self, what: str) -> Unsupported:
        return Unsupported(f"unsupported by {self.name}: {WHAT_IT_IS} {what}")

    def zero_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, Any]:
        key = repr((save, load))
        if key not in self._runs:  # the area's three tests ask about one run
            self._runs[key] = self._round_trip(save, load, example)
        return self._runs[key]

    def _round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, Any]:
        from conformance.peers.deepspeed import worlds

        with tempfile.TemporaryDirectory(prefix="shardspec-deepspeed-") as path:
            saved = _world(
                f"{WORLDS}:save_world", save["dp"], path, save["stage"], save["dtype"],
                save["shapes"],
            )  # fmt: skip
            raise_failed("save", saved, example)
            fp32 = worlds.zero_to_fp32(path)
            worlds.to_universal(path)
            loaded = _world(
                f"{WORLDS}:load_world", load["dp"], path, "universal", load["stage"],
                save["dtype"], save["shapes"],
            )  # fmt: skip
            raise_failed("load", loaded, example)
        return {
            "save": {r: v for r, (_, v) in saved.items()},
            "load": {r: v for r, (_, v) in loaded.items()},
            "fp32": fp32,
        }

    def zero_set_full(self, save: dict[str, Any], example: str) -> dict[int, dict[str, Any]]:
        got = _world(
            f"{WORLDS}:set_world", save["dp"], save["stage"], save["dtype"], save["shapes"]
        )
        raise_failed("setting of full values", got, example)
        return {r: v for r, (_, v) in got.items()}


def _world(fn: str, world: int, *args: Any) -> dict[int, tuple[str, Any]]:
    return world_outcomes(fn, world, *args, timeout=WORLD_TIMEOUT, error_grace=ERROR_GRACE)
