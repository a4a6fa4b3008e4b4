"""DeepSpeed 0.19.8: ``load_universal`` raises IndexError on a rank whose ZeRO-1/2 partition
holds only padding, while the other ranks wait for it in a collective.

Needs DeepSpeed 0.19.8 beside torch 2.13.0 (CPU), built with no op compiled:

    pip install torch==2.13.0 setuptools wheel
    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8

Run on 2 CPU ranks: ``DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 <this file>``.
DeepSpeed's CPU backend compiles a shared-memory all-reduce when it starts; this file skips
that (``build_shm_op`` answers None), which changes nothing below.
"""

import importlib
import os
import subprocess
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "deepspeed-universal-load-rank-past-the-data",
    "title": "DeepSpeed 0.19.8: load_universal raises IndexError on a rank whose ZeRO-1/2 "
    "partition holds only padding; the other ranks wait in a collective",
    "area": "zero_checkpoint",
    "rule": "FLAT-8",
    "upstream": None,
    "impl": "deepspeed",
    "needs": ["deepspeed"],
    "issue_text": """### load_universal: IndexError on a rank that holds no parameter element

With more data-parallel ranks than a parameter group has elements to give them, ZeRO-1/2 pads
the flat buffer to a multiple of 2 x dp and some ranks' partitions hold padding only. Loading a
universal checkpoint there, `BaseOptimizer.load_hp_checkpoint_state_from_checkpoint_dir` collects
the optimizer `step` of each parameter fragment the rank holds and reads `steps[0]`: on a rank
with no fragment the list is empty.

```python
# 2 ranks, ZeRO-2, torch.optim.Adam, one parameter of 1 element (padded to 4, 2 a rank)
engine.save_checkpoint(path, tag="saved")
# python -m deepspeed.checkpoint.ds_to_universal --input_folder path/saved
#     --output_folder path/universal --inject_missing_state
engine2 = deepspeed.initialize(..., config={..., "checkpoint": {"load_universal": True}})
engine2.load_checkpoint(path, tag="universal")
# rank 1: IndexError: list index out of range; rank 0 waits for it in a collective
```

Expected: a rank whose partition is padding only loads nothing into it and goes on (its step
from the checkpoint's optimizer state), as the save itself does.""",
    "nproc": 2,
    "torch_does": "rank 1, whose ZeRO-2 partition of a 1-element parameter is padding only, "
    "raises IndexError (list index out of range) in load_checkpoint of the universal "
    "checkpoint; rank 0 waits for it",
    "spec_says": "every rank loads its FLAT-6 partition of the saved values, padding included, "
    "and every parameter's values come back (FLAT-8)",
    "tests": ["test_zero_checkpoint.py::test_a_universal_checkpoint_loads_on_ranks_past_the_data"],
}

os.environ.setdefault("DS_ACCELERATOR", "cpu")
try:
    import deepspeed

    # not `import deepspeed.comm.torch as ...`: deepspeed.comm re-exports torch by that name
    ds_torch = importlib.import_module("deepspeed.comm.torch")
except (ImportError, OSError) as e:
    print(f"SKIPPED deepspeed does not load here: {type(e).__name__}: {e}")
    sys.exit(0)


class One(torch.nn.Module):
    def __init__(self, fill: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), fill))

    def forward(self) -> torch.Tensor:
        return self.w.sum()


def engine(fill: float, **checkpoint: bool):
    model = One(fill)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": dist.get_world_size(),
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "checkpoint": checkpoint,
    }
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return deepspeed.initialize(model=model, optimizer=opt, config=config)[0]


def main() -> int:
    ds_torch.build_shm_op = lambda: None  # no op compiled (see the docstring)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    path = os.path.join(tempfile.gettempdir(), f"deepspeed-repro-{os.environ['MASTER_PORT']}")
    first = engine(1.0)
    first.backward(first())
    first.step()
    first.save_checkpoint(path, tag="saved")
    dist.barrier()
    if rank == 0:
        subprocess.run(
            [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
             f"{path}/saved", "--output_folder", f"{path}/universal", "--inject_missing_state"],
            check=True, capture_output=True,
        )  # fmt: skip
    dist.barrier()
    second = engine(7.0, load_universal=True)
    try:
        second.load_checkpoint(path, tag="universal")
    except IndexError as e:
        print(
            f"DIVERGES rank {rank}: deepspeed load_checkpoint of the universal checkpoint of a "
            f"1-element parameter on 2 ZeRO-2 ranks raised IndexError: {e} on the rank whose "
            "partition is padding only; the spec says every rank loads its partition and the "
            "parameter comes back as 1 element (FLAT-8)"
        )
        return 1
    print(f"rank {rank}: loaded {deepspeed.utils.safe_get_full_fp32_param(second.module.w)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
