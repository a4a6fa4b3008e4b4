"""Megatron-Core 0.19.2: a regular grid (axis_fragmentations) with an empty cell fails on rank 0
only, with a bare AssertionError, while rank 1 enters the save and waits in a collective.

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
    "id": "megatron-grid-empty-cell-asserts-on-rank-0",
    "title": "Megatron-Core: a regular grid (axis_fragmentations) with an empty cell fails a "
    "bare assert on rank 0 only; rank 1 enters the save and waits in a collective",
    "area": "checkpoint_files",
    "rule": "CKPT-4",
    "upstream": None,
    "impl": "megatron",
    "needs": ["megatron-core"],
    "issue_text": """### save: a grid with an empty cell asserts on rank 0 and hangs the others

One row on 2 ranks stated as a grid of 2 (`torch.chunk`'s split: row 0 on rank 0, nothing on
rank 1, as a DTensor of fewer rows than ranks holds it): rank 1's
`ShardedTensor(..., local_shape=(0,), global_shape=(1,), global_offset=(1,),
axis_fragmentations=(2,))` passes its own checks, and `validate_sharding_integrity`, which runs
on rank 0 only, stops at `assert sharding.local_shape == local_shape` with a bare
`AssertionError: ((0,), (1,), ShardedTensor(...))`, while rank 1 waits in the save's
collectives until the process group times out.

```python
# 2 ranks, megatron-core 0.19.2, torch 2.13.0 CPU, gloo
start, rows = [(0, 1), (1, 0)][rank]
st = ShardedTensor("w", data, torch.float32, (rows,), (1,), (start,), (2,))
dist_checkpointing.save({"w": st}, path)  # rank 0: AssertionError; rank 1 hangs
```

Expected: the grid with an empty cell is saved (an empty cell holds nothing), or it is refused
on every rank with a message that says why, before any rank enters a collective.""",
    "nproc": 2,
    "torch_does": "rank 0 raises a bare AssertionError ((0,), (1,), ShardedTensor(...)) in its "
    "global validation; rank 1 enters the save and waits in a collective",
    "spec_says": "a description the save refuses is refused on every rank, before any rank "
    "writes or enters a collective (CKPT-4); an empty cell holds nothing and is valid (BOX-2)",
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
    full = torch.arange(1, dtype=torch.float32)
    start, rows = [(0, 1), (1, 0)][rank]  # torch.chunk's split of 1 row on 2 ranks
    try:
        data = full[start : start + rows].clone()
        st = ShardedTensor("w", data, torch.float32, (rows,), (1,), (start,), (2,))
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
        out = ShardedTensor("w", torch.zeros(1), torch.float32, (1,), (1,), (0,), None)
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
