"""Megatron-Core 0.19.2: an uneven split described with ShardedTensor.from_rank_offsets fails
on rank 0 only, while rank 1 goes on into the save and waits in a collective.

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
    "id": "megatron-from-rank-offsets-uneven-split-hangs",
    "title": "Megatron-Core: an uneven split described with ShardedTensor.from_rank_offsets is "
    "refused on rank 0 only; rank 1 goes on into the save and waits in a collective",
    "area": "checkpoint_files",
    "rule": "CKPT-4",
    "upstream": None,
    "impl": "megatron",
    "needs": ["megatron-core"],
    "issue_text": """### save: an uneven from_rank_offsets split fails on rank 0, hangs rank 1

`ShardedTensor.from_rank_offsets(key, data, (0, rank, 2))` computes the global shape from the
local one (`axis_fragm * data.shape[axis]`). With 7 rows on 2 ranks (4 and 3, `torch.chunk`'s
split) rank 0 states a global shape of 8 and rank 1 one of 6. Nothing refuses that on the rank
that builds it; `validate_sharding_integrity` runs on rank 0 only, where
`_validate_sharding_for_key` raises `AssertionError` (global shapes differ). Rank 1 goes on
into the save's planning and waits in its gather of the local plans until the process group
times out. No `.metadata` is written.

```python
# 2 ranks, megatron-core 0.19.2, torch 2.13.0 CPU, gloo
rows = [(0, 4), (4, 3)][rank]
st = ShardedTensor.from_rank_offsets("w", torch.arange(7.)[rows[0]:sum(rows)].clone(), (0, rank, 2))
dist_checkpointing.save({"w": st}, path)  # rank 0: AssertionError; rank 1: hangs
```

Expected: the description is refused on every rank (a `CheckpointingException` naming the
key and the ranks' global shapes) before any rank writes or enters a collective; or, since
the split is `torch.chunk`'s, saved as an uneven split.""",
    "nproc": 2,
    "torch_does": "rank 0 raises AssertionError in validate_sharding_integrity; rank 1 goes on "
    "into the save's planning and waits in a collective until the process group times out",
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
    st = ShardedTensor.from_rank_offsets("w", full[start : start + rows].clone(), (0, rank, 2))
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
