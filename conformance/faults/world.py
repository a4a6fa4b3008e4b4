"""Short-lived gloo worlds for the faults area: W spawned ranks run one scenario each and
exit, so a rank can be killed, leak, or be measured without touching the session's pool.

Every rank joins through a :class:`torch.distributed.FileStore` in a temporary folder (no
store socket) and gloo on the loopback interface; it writes its verdict as JSON to
``<folder>/<rank>.json``, which the driver reads back: nothing a rank sends is unpickled.
A rank that writes no verdict (killed, hung past the deadline) comes back as None, and the
driver kills whatever is still running when the deadline passes.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from shardspec.testing import scaled

__all__ = ["run_world"]

Verdict = dict[str, Any]


def _rank_main(
    rank: int, world: int, folder: str, scenario: Callable[..., Verdict], kwargs: dict[str, Any]
) -> None:
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "store"), world)  # type: ignore[attr-defined]
    # A deadline of our own well below the tests' 30 s: what the faults area checks is that
    # errors arrive without it, and it bounds the damage if they do not.
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        verdict = scenario(rank, world, **kwargs)
    except BaseException as e:  # the verdict of a rank that raised is the error itself
        verdict = {"error": type(e).__name__, "message": str(e), "tb": traceback.format_exc()}
    Path(folder, f"{rank}.json.tmp").write_text(json.dumps(verdict))
    os.replace(os.path.join(folder, f"{rank}.json.tmp"), os.path.join(folder, f"{rank}.json"))
    if not verdict.get("skip_teardown"):
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer died on purpose: nothing left to tear down cleanly
            pass
    os._exit(0)  # skip interpreter teardown: the verdict is written, nothing else matters


def run_world(
    world: int, scenario: Callable[..., Verdict], deadline: float, **kwargs: Any
) -> list[Verdict | None]:
    """Run ``scenario(rank, world, **kwargs)`` on ``world`` fresh gloo ranks; each rank's
    verdict (a JSON-able dict, or ``{"error": ..., "message": ...}`` if it raised), or None
    for a rank that wrote none within ``deadline`` seconds (for an idle machine: stretched by
    ``shardspec.testing.slowness``). ``scenario`` must be a
    module-level function (the ranks are spawned)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="shardspec-faults-") as folder:
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, folder, scenario, kwargs), daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
        end = time.monotonic() + scaled(deadline)  # longer on a loaded machine
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        out: list[Verdict | None] = []
        for r in range(world):
            path = Path(folder, f"{r}.json")
            out.append(json.loads(path.read_text()) if path.exists() else None)
        return out
