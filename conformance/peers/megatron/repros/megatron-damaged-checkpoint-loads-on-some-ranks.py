"""Megatron-Core 0.19.2: a checkpoint whose data file was cut short loads on the ranks that
do not read that file, while the others raise.

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
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "megatron-damaged-checkpoint-loads-on-some-ranks",
    "title": "Megatron-Core: a checkpoint with a data file cut short loads without error on "
    "the ranks that do not read that file; only the others raise",
    "area": "checkpoint_files",
    "rule": "CKPT-16",
    "upstream": None,
    "impl": "megatron",
    "needs": ["megatron-core"],
    "issue_text": """### dist_checkpointing.load: a damaged file fails some ranks, others load

`TorchDistLoadShardedStrategy.load` calls `torch.distributed.checkpoint.load(...,
no_dist=True)`: every rank plans and reads alone, so a rank whose pieces all lie in intact
files returns normally while a rank that reads a damaged file raises. A job then goes on with
some ranks loaded and the others failed (or, where the error is caught per rank, with half a
model restored).

```python
# 2 ranks, megatron-core 0.19.2, torch 2.13.0 CPU, gloo: rows 0-1 on rank 0, rows 2-3 on rank 1
st = ShardedTensor("w", piece, torch.float32, (2,), (4,), (2 * rank,), None)
dist_checkpointing.save({"w": st}, path)
# cut path/__1_0.distcp to half its size, then load each rank's own rows:
dist_checkpointing.load({"w": ShardedTensor("w", torch.zeros(2), ...)}, path)
# rank 0 returns [0., 1.]; rank 1 raises
```

Expected: a load that fails on one rank fails on every rank (as `torch.distributed.checkpoint.load`
does when it runs with its process group: `read_data` runs inside an all-gather).""",
    "nproc": 2,
    "torch_does": "the rank that reads only intact files returns normally; the rank that reads "
    "the file cut short raises",
    "spec_says": "a damaged checkpoint is refused on every rank, so no rank returns half a "
    "load as if it had succeeded (CKPT-16)",
    "tests": ["test_checkpoint_files.py::test_a_damaged_checkpoint_is_refused_on_every_rank"],
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
    full = torch.arange(4, dtype=torch.float32)
    piece = ShardedTensor("w", full[2 * rank : 2 * rank + 2].clone(), torch.float32, (2,), (4,),
                          (2 * rank,), None)  # fmt: skip
    dist_checkpointing.save({"w": piece}, path)
    dist.barrier()
    if rank == 0:
        victim = os.path.join(path, "__1_0.distcp")  # rank 1's data file
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    dist.barrier()
    dst = ShardedTensor("w", torch.zeros(2), torch.float32, (2,), (4,), (2 * rank,), None)
    try:
        got = dist_checkpointing.load({"w": dst}, path)["w"]
        outcome = f"loaded {got.tolist()}"
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        outcome = f"raised {type(e).__name__}: {str(e).strip().splitlines()[-1][:120]}"
    store.set(f"outcome{rank}", outcome)
    store.wait([f"outcome{1 - rank}"], timedelta(seconds=30))
    other = store.get(f"outcome{1 - rank}").decode()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    if outcome.startswith("raised") != other.startswith("raised"):
        print(
            f"DIVERGES rank {rank}: with __1_0.distcp cut short, megatron {outcome}; rank "
            f"{1 - rank} {other}; the spec says the load is refused on every rank"
        )
        return 1
    return 0


# Megatron's save starts a multiprocessing Manager with the spawn method, which imports
# this file again in the new process: only the main process runs main().
if __name__ == "__main__":
    sys.exit(main())
