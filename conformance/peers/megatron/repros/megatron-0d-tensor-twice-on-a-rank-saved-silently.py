"""Megatron-Core 0.19.2: a 0-d tensor stated twice on one rank, each as the main replica
(replica_id 0) and with different values, is saved once without a word.

Needs Megatron-Core 0.19.2 beside torch 2.13.0 (CPU), Python 3.11 (its cp311 wheel declares
Requires-Python >= 3.12, so it is installed without that check):

    pip download megatron-core==0.19.2 --no-deps --ignore-requires-python -d wheels
    pip install --no-deps --ignore-requires-python wheels/megatron_core-0.19.2-*.whl
    pip install numpy "packaging>=24.2" triton psutil

On a CPU-only torch Megatron's save calls torch.cuda.synchronize() and
torch.cuda.current_device(); this file answers those two for the CPU when CUDA is absent.
"""

import shutil
import sys
import tempfile

import torch
import torch.distributed as dist

DEFECT = {
    "id": "megatron-0d-tensor-twice-on-a-rank-saved-silently",
    "title": "Megatron-Core: a 0-d tensor stated twice on a rank, both main replicas, is saved "
    "once without a word",
    "area": "checkpoint_files",
    "rule": "CKPT-4",
    "upstream": None,
    "impl": "megatron",
    "needs": ["megatron-core"],
    "issue_text": """### save: two main replicas of a 0-d tensor on a rank are saved once, silently

Two `ShardedTensor`s of the 0-d key `w` on one rank, both `replica_id=0`, with values 1 and
2, are saved by `dist_checkpointing.save` without a word, and a load gives 2: the first
value is dropped. Megatron leaves such overlaps to torch's global-plan check
(`_validate_global_plan`), which refuses the same thing for a 1-d tensor (two main replicas
of rows 0-1: `ValueError: Failed to validate global plan`) but skips 0-d tensors.

```python
# 1 rank, megatron-core 0.19.2, torch 2.13.0 CPU, gloo
a = ShardedTensor("w", torch.tensor(1.0), torch.float32, (), (), (), None)
b = ShardedTensor("w", torch.tensor(2.0), torch.float32, (), (), (), None)
dist_checkpointing.save({"a": a, "b": b}, path)  # returns; a load gives 2.0
```

Expected: the save refuses two main replicas of one tensor, 0-d as any other, on every rank.""",
    "nproc": 1,
    "torch_does": "saves two main replicas of a 0-d tensor (1.0 and 2.0) on one rank without a "
    "word; a load gives 2.0",
    "spec_says": "a layout holding an element twice (twice on one rank included) is refused "
    "on every rank before anything is written (CKPT-4)",
    "tests": [
        "test_checkpoint_files.py::test_a_save_of_an_invalid_layout_is_refused_on_every_rank"
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
    dist.init_process_group("gloo")
    path = tempfile.mkdtemp(prefix="megatron-repro-")
    state = {
        "a": ShardedTensor("w", torch.tensor(1.0), torch.float32, (), (), (), None),
        "b": ShardedTensor("w", torch.tensor(2.0), torch.float32, (), (), (), None),
    }
    try:
        dist_checkpointing.save(state, path)
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        print(f"refused: {type(e).__name__}")
        shutil.rmtree(path, ignore_errors=True)
        dist.destroy_process_group()
        return 0
    out = ShardedTensor("w", torch.tensor(0.0), torch.float32, (), (), (), None)
    got = dist_checkpointing.load({"w": out}, path)["w"]
    shutil.rmtree(path, ignore_errors=True)
    dist.destroy_process_group()
    print(
        "DIVERGES rank 0: megatron saves two main replicas of a 0-d tensor (1.0 and 2.0) on "
        f"one rank without a word and loads {got.item()}; the spec says the save is refused "
        "(CKPT-4)"
    )
    return 1


# Megatron's save starts a multiprocessing Manager with the spawn method, which imports
# this file again in the new process: only the main process runs main().
if __name__ == "__main__":
    sys.exit(main())
