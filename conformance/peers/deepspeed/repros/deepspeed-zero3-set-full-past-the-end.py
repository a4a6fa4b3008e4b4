"""DeepSpeed 0.19.8: under ZeRO-3, ``safe_set_full_fp32_param`` (and
``safe_set_full_optimizer_state``) raise on the last rank for any parameter whose element count
does not divide by the data-parallel size.

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
    "id": "deepspeed-zero3-set-full-past-the-end",
    "title": "DeepSpeed 0.19.8: ZeRO-3's safe_set_full_fp32_param and "
    "safe_set_full_optimizer_state raise on the last rank when numel does not divide by dp",
    "area": "zero_checkpoint",
    "rule": "FLAT-7",
    "upstream": None,
    "impl": "deepspeed",
    "needs": ["deepspeed"],
    "issue_text": """### ZeRO-3: safe_set_full_fp32_param fails when numel does not divide by dp

`DeepSpeedZeroOptimizer_Stage3.set_full_hp_param` narrows the full value at
`partition.numel() * rank` for `partition.numel()` elements. A rank's partition is
`ceil(numel / dp)` elements, padding included, so on the last rank the narrow runs past the end
of the value whenever `numel % dp != 0`:

```python
# 2 ranks, ZeRO-3, torch.optim.Adam, a parameter of shape (3, 5): 15 elements, 8 a rank
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
deepspeed.utils.safe_set_full_fp32_param(model.w, torch.arange(15.0).reshape(3, 5))
# rank 0 sets elements 0-7; rank 1 raises
# RuntimeError: start (8) + length (8) exceeds dimension size (15).
```

`safe_set_full_optimizer_state` takes the same path. Expected: each rank copies the part of
the value inside its partition (`[rank * p, min((rank + 1) * p, numel))`) and leaves its
padding, as `get_full_hp_param` already strips it when it gathers.""",
    "nproc": 2,
    "torch_does": "rank 1 raises RuntimeError (start 8 + length 8 exceeds dimension size 15) "
    "when setting a (3, 5) parameter's full fp32 value on 2 ranks; rank 0 sets its part",
    "spec_says": "each rank holds elements [r * p, min((r + 1) * p, numel)) of the parameter, "
    "p = ceil(numel / dp), the rest of its partition padding (FLAT-7): setting a full value "
    "writes those elements on every rank",
    "tests": [
        "test_zero_checkpoint.py::test_full_values_set_through_its_api_land_in_the_rules_partitions"
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


class One(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3, 5))

    def forward(self) -> torch.Tensor:
        return self.w.sum()


def main() -> int:
    ds_torch.build_shm_op = lambda: None  # no op compiled (see the docstring)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = One()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": dist.get_world_size(),
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    engine.backward(engine())
    engine.step()
    try:
        deepspeed.utils.safe_set_full_fp32_param(model.w, torch.arange(15.0).reshape(3, 5))
        outcome = "set"
    except RuntimeError as e:
        outcome = f"raised RuntimeError: {e}"
    if outcome != "set":
        print(
            f"DIVERGES rank {rank}: deepspeed safe_set_full_fp32_param of a (3, 5) parameter "
            f"on 2 ZeRO-3 ranks {outcome}; the spec says rank {rank} sets elements "
            f"[{8 * rank}, {min(8 * rank + 8, 15)}) of it (FLAT-7)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
