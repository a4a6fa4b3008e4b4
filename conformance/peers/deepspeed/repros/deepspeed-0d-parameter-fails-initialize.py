"""DeepSpeed 0.19.8: ``deepspeed.initialize`` fails on a model with a 0-d parameter (a learnable
scalar, such as CLIP's ``logit_scale``): its ``_broadcast_model`` views each parameter as bytes,
which torch refuses for a 0-d tensor.

Needs DeepSpeed 0.19.8 beside torch 2.13.0 (CPU), built with no op compiled:

    pip install torch==2.13.0 setuptools wheel
    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8

Run on 1 CPU rank: ``DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 1 <this file>``.
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
    "id": "deepspeed-0d-parameter-fails-initialize",
    "title": "DeepSpeed 0.19.8: deepspeed.initialize raises on a model with a 0-d parameter "
    "(_broadcast_model views it as bytes)",
    "area": "zero_checkpoint",
    "rule": "FLAT-6",
    "upstream": None,
    "impl": "deepspeed",
    "needs": ["deepspeed"],
    "issue_text": """### initialize: a 0-d parameter fails _broadcast_model

`DeepSpeedEngine._broadcast_model` broadcasts `p.data.view(torch.uint8)` for every parameter;
torch refuses that view for a 0-d tensor, so a model with a learnable scalar (CLIP's
`logit_scale`, a temperature, a gate) cannot be initialized, under any ZeRO stage:

```python
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        self.w = torch.nn.Parameter(torch.ones(3))

engine, *_ = deepspeed.initialize(model=M(), optimizer=opt, config=config)
# RuntimeError: self.dim() cannot be 0 to view Float as Byte (different element sizes)
```

Expected: a 0-d parameter is one element of the flat buffer (as `torch.flatten` gives it), and
the broadcast views it as `p.data.reshape(1)` or broadcasts it as it is.""",
    "nproc": 1,
    "torch_does": "deepspeed.initialize of a model with a 0-d parameter raises RuntimeError "
    "(self.dim() cannot be 0 to view Float as Byte) in _broadcast_model, at ZeRO stage 2",
    "spec_says": "a 0-d parameter is one element of the flat buffer (FLAT-6): initialized, "
    "saved and loaded as any other",
    "tests": ["test_zero_checkpoint.py::test_a_zero_dimensional_parameter_is_saved_and_loaded"],
}

os.environ.setdefault("DS_ACCELERATOR", "cpu")
try:
    import deepspeed

    # not `import deepspeed.comm.torch as ...`: deepspeed.comm re-exports torch by that name
    ds_torch = importlib.import_module("deepspeed.comm.torch")
except (ImportError, OSError) as e:
    print(f"SKIPPED deepspeed does not load here: {type(e).__name__}: {e}")
    sys.exit(0)


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self) -> torch.Tensor:
        return self.scale * self.w.sum()


def main() -> int:
    ds_torch.build_shm_op = lambda: None  # no op compiled (see the docstring)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = Scaled()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": dist.get_world_size(),
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    try:
        deepspeed.initialize(model=model, optimizer=opt, config=config)
    except RuntimeError as e:
        print(
            f"DIVERGES rank {rank}: deepspeed.initialize of a model with a 0-d parameter "
            f"raised RuntimeError: {e}; the spec says a 0-d parameter is one element of the "
            "flat buffer (FLAT-6)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
