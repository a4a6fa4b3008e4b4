"""Megatron-Core 0.19.2: an uneven split stated as a regular grid (axis_fragmentations) fails
on rank 1 only, while rank 0 enters the save and waits in a collective.

Needs Megatron-Core 0.19.2 beside torch 2.13.0 (CPU), Python 3.11 (its cp311 wheel declares
Requires-Python >= 3.12, so it is installed without that check):

    pip download megatron-core==0.19.2 --no-deps --ignore-requires-python -d wheels
    pip install --no-deps --ignore-requires-python wheels/megatron_core-0.19.2-*.whl
    pip install numpy "packaging>=24.2" triton psutil

On a CPU-only torch Megatron's save calls torch.cuda.synchronize() and
torch.cuda.current_device(); this file answers those two for the CPU when CUDA is absent.
"""

import os
import shutil
import sys
import tempfile
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "megatron-grid-uneven-split-hangs",
    "title": "Megatron-Core: an uneven split stated as a regular grid (axis_fragmentations) is "
    "refused on rank 1 only; rank 0 enters the save and waits in a collective",
    "area": "checkpoint_files",
    "rule": "CKPT-4",
    "upstream": None,
    "impl": "megatron",
    "needs": ["megatron-core"],
    "issue_text": """### save: a ShardedTensor refused on one rank hangs the others

A ShardedTensor with `axis_fragmentations` checks in `validate_metadata_integrity` that each
global offset is divisible by the local shape. For 7 rows on 2 ranks stated as a grid of 2
(rows 0-3 and 4-6, `torch.chunk`'s split) rank 1's `ShardedTensor(..., global_offset=(4,),
local_shape=(3,), axis_fragmentations=(2,))` raises `CheckpointingException: Global offset (4)
must be divisible by local shape (3)` on rank 1 only; rank 0's piece passes, rank 0 calls
`dist_checkpointing.save` and waits in its first collective (the metadata exchange) until the
process group times out.

```python
# 2 ranks, megatron-core 0.19.2, torch 2.13.0 CPU, gloo
start, rows = [(0, 4), (4, 3)][rank]
st = ShardedTensor("w", data, torch.float32, (rows,), (7,), (start,), (2,))  # rank 1 raises
dist_checkpointing.save({"w": st}, path)  # rank 0 hangs
```

Expected: a description is refused on every rank, or the save agrees on every rank's
description before its first collective, so that one rank's refusal fails the save
everywhere instead of hanging the others (and the grid form either takes `torch.chunk`'s
uneven split or refuses it on every rank).""",
    "nproc": 2,
    "torch_does": "rank 1 raises CheckpointingException (global offset 4 not divisible by local "
    "shape 3); rank 0 enters the save and waits in a collective until the group times out",
    "spec_says": "a description the save refuses is refused on every rank, before any rank "
    "writes or enters a collective (CKPT-4)",
    "tests": [
        "test_checkpoint_files.py::"
        "test_an_uneven_grid_saved_in_the_implementations_forms_loads_on_another_world"
    ],
}

try:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
except (ImportError, OSError) as e:
    print(f"SKIPPED megatron-core does not load here: {type(e).__name__}: {e}")
    sys.exit(0)


def main() -> int:
    if not torch.cuda.is_available():  # Megatron's save asks CUDA even for CPU tensors
        torch.cuda.synchronize = lambda *args, **kwargs: None
        torch.cuda.current_device = lambda: "cpu"

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, store = dist.get_rank(), dist.distributed_c10d._get_default_store()
    path = os.path.join(tempfile.gettempdir(), f"megatron-repro-{os.environ['MASTER_PORT']}")
    os.makedirs(path, exist_ok=True)

    def listing() -> list[str]:
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def stuck() -> None:  # a rank left inside the save's collectives
        print(
            f"DIVERGES rank {rank}: megatron's save has not returned after 45 s (it waits in a "
            f"collective); files {listing()}; the spec says the save is refused on every rank"
        )
        sys.stdout.flush()
        shutil.rmtree(path, ignore_errors=True)
        os._exit(1)

    watchdog = threading.Timer(45, stuck)
    watchdog.start()
    full = torch.arange(7, dtype=torch.float32)
    start, rows = [(0, 4), (4, 3)][rank]  # torch.chunk's split of 7 rows on 2 ranks
    try:
        data = full[start : start + rows].clone()
        st = ShardedTensor("w", data, torch.float32, (rows,), (7,), (start,), (2,))
        dist_checkpointing.save({"w": st}, path)
        outcome = "saved"
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        outcome = f"raised {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    watchdog.cancel()
    store.set(f"outcome{rank}", outcome)
    try:
        store.wait([f"outcome{1 - rank}"], timedelta(seconds=15))
        other = store.get(f"outcome{1 - rank}").decode()
    except Exception:
        other = "still waiting in a collective after 15 s"
    files = listing()
    if outcome.startswith("raised") != other.startswith("raised") or "waiting" in other:
        print(
            f"DIVERGES rank {rank}: megatron {outcome}; rank {1 - rank} {other}; files {files}; "
            "the "
            "spec says the description is refused on every rank before anything is written"
        )
        sys.stdout.flush()
        if "waiting" not in other:
            shutil.rmtree(path, ignore_errors=True)
        os._exit(1)
    if outcome == "saved":  # accepted on both ranks: then it must load as saved
        out = ShardedTensor("w", torch.zeros(7), torch.float32, (7,), (7,), (0,), None)
        got = dist_checkpointing.load({"w": out}, path)["w"]
        if not torch.equal(got, full):
            print(f"DIVERGES rank {rank}: loads {got.tolist()}; the spec says {full.tolist()}")
            os._exit(1)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return 0


# Megatron's save starts a multiprocessing Manager with the spawn method, which imports
# this file again in the new process: only the main process runs main().
if __name__ == "__main__":
    sys.exit(main())
