"""DeepSpeed 0.19.8: under ZeRO-3, a module with a zero-size parameter (no element) fails its
forward: gathering the parameter's partitions concatenates an empty list.

Needs DeepSpeed 0.19.8 beside torch 2.13.0 (CPU), built with no op compiled:

    pip install torch==2.13.0 setuptools wheel
    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8

Run on 2 CPU ranks: ``DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 <this file>``.
DeepSpeed's CPU backend compiles a shared-memory all-reduce when it starts; this file skips
that (``build_shm_op`` answers None), which changes nothing below.
"""

import importlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "deepspeed-zero3-zero-size-parameter-fails-forward",
    "title": "DeepSpeed 0.19.8: ZeRO-3 fails the forward of a module holding a zero-size "
    "parameter (torch.cat of an empty list when it gathers it)",
    "area": "zero_checkpoint",
    "rule": "FLAT-7",
    "upstream": None,
    "impl": "deepspeed",
    "needs": ["deepspeed"],
    "issue_text": """### ZeRO-3: a zero-size parameter fails the parameter fetch

A module with a parameter of shape (0, 3) beside a (3,) one, under ZeRO-3 on 2 ranks
(`stage3_param_persistence_threshold` 0, so that every parameter is partitioned): the forward's
`fetch_sub_module` gathers the zero-size parameter and `AllGatherHandle.wait` calls
`torch.cat(partitions)` on an empty list:

```python
self.empty = torch.nn.Parameter(torch.ones(0, 3))
self.w = torch.nn.Parameter(torch.ones(3))
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)  # stage 3
engine()  # ValueError: torch.cat(): expected a non-empty list of Tensors
```

Expected: a parameter of no element gathers to an empty tensor of its shape (its ZeRO-3
partitions are `ceil(0 / dp) = 0` elements each), as ZeRO-1/2 handle it.""",
    "nproc": 2,
    "torch_does": "the forward of a module with a (0, 3) parameter under ZeRO-3 on 2 ranks "
    "raises ValueError (torch.cat(): expected a non-empty list of Tensors)",
    "spec_says": "a parameter of no element has empty partitions (FLAT-7): gathered, saved and "
    "loaded as an empty tensor of its shape",
    "tests": [
        "test_zero_checkpoint.py::test_a_zero_size_parameter_is_saved_and_loaded_under_zero3"
    ],
}

os.environ.setdefault("DS_ACCELERATOR", "cpu")
try:
    import deepspeed

    # not `import deepspeed.comm.torch as ...`: deepspeed.comm re-exports torch by that name
    ds_torch = importlib.import_module("deepspeed.comm.torch")
except (ImportError, OSError) as e:
    print(f"SKIPPED deepspeed does not load here: {type(e).__name__}: {e}")
    sys.exit(0)


class WithEmpty(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.empty = torch.nn.Parameter(torch.ones(0, 3))
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self) -> torch.Tensor:
        return self.empty.sum() + self.w.sum()


def main() -> int:
    ds_torch.build_shm_op = lambda: None  # no op compiled (see the docstring)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = WithEmpty()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": dist.get_world_size(),
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    try:
        engine.backward(engine())
        engine.step()
    except (RuntimeError, ValueError) as e:
        print(
            f"DIVERGES rank {rank}: the ZeRO-3 forward of a module with a (0, 3) parameter "
            f"raised {type(e).__name__}: {e}; the spec says a parameter of no element has "
            "empty partitions (FLAT-7)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
