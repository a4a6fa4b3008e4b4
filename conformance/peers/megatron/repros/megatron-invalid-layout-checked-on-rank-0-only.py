"""Megatron-Core 0.19.2: pieces that leave a gap are refused by torch's global-plan check on
rank 0 only, while rank 1 writes its data file and waits in a collective.

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
    "id": "megatron-invalid-layout-checked-on-rank-0-only",
    "title": "Megatron-Core: a save whose pieces leave a gap (or overlap) is checked only by "
    "torch's global-plan check on rank 0; rank 1 writes its file and waits in a collective",
    "area": "checkpoint_files",
    "rule": "CKPT-4",
    "upstream": None,
    "impl": "megatron",
    "needs": ["megatron-core"],
    "issue_text": """### save: a gap or an overlap fails on rank 0 and hangs the others

For uneven ShardedTensors (`axis_fragmentations=None`) `_validate_sharding_for_key` returns
early ("In case of uneven sharding we defer the validation to DCP"). DCP's check runs in
`MCoreSavePlanner.create_global_plan`, which the decentralized save plan calls on the
coordinator only: rank 0 raises `ValueError: Failed to validate global plan`, while rank 1
writes `__1_0.distcp` and waits in the final gather of write results until the process group
times out. No `.metadata` is written, but the data file is.

```python
# 2 ranks, megatron-core 0.19.2, torch 2.13.0 CPU, gloo: rows 0-1 on rank 0, rows 3-4 on
# rank 1 of a 5-row tensor (row 2 in no piece)
start = [0, 3][rank]
st = ShardedTensor("w", data[start:start + 2].clone(), torch.float32, (2,), (5,), (start,), None)
dist_checkpointing.save({"w": st}, path)  # rank 0: ValueError; rank 1: writes, then hangs
```

Expected: the save checks the pieces of every tensor on every rank (or shares rank 0's
verdict) before anything is written, and fails on every rank naming the gap.""",
    "nproc": 2,
    "torch_does": "rank 0 raises ValueError (Failed to validate global plan) in the "
    "coordinator-only global plan; rank 1 writes its data file and waits in a collective",
    "spec_says": "a save of pieces with a gap or an overlap is refused on every rank before "
    "anything is written (CKPT-4)",
    "tests": [
        "test_checkpoint_files.py::test_a_save_of_an_invalid_layout_is_refused_on_every_rank",
        "test_checkpoint.py::test_a_checkpoint_saved_on_one_world_loads_on_another",
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
    full = torch.arange(5, dtype=torch.float32)
    start = [0, 3][rank]  # rows 0-1 and 3-4: row 2 is in no piece
    st = ShardedTensor(
        "w", full[start : start + 2].clone(), torch.float32, (2,), (5,), (start,), None
    )
    try:
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
            "spec says the gap is refused on every rank before anything is written"
        )
        sys.stdout.flush()
        if "waiting" not in other:
            shutil.rmtree(path, ignore_errors=True)
        os._exit(1)
    if outcome == "saved":
        print(
            f"DIVERGES rank {rank}: megatron saved a tensor with row 2 in no piece; files {files}"
        )
        os._exit(1)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return 0


# Megatron's save starts a multiprocessing Manager with the spawn method, which imports
# this file again in the new process: only the main process runs main().
if __name__ == "__main__":
    sys.exit(main())
