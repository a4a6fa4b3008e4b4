"""DeepSpeed 0.19.8: a universal checkpoint made from a ZeRO-1/2 save does not load under ZeRO-3
(nor one made from a ZeRO-3 save under ZeRO-1/2): every rank fails with a bare AssertionError.

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
    "id": "deepspeed-universal-load-across-zero3-and-zero12",
    "title": "DeepSpeed 0.19.8: a universal checkpoint of a ZeRO-1/2 save does not load under "
    "ZeRO-3, nor one of a ZeRO-3 save under ZeRO-1/2 (bare AssertionError on every rank)",
    "area": "zero_checkpoint",
    "rule": "FLAT-8",
    "upstream": None,
    "impl": "deepspeed",
    "needs": ["deepspeed"],
    "issue_text": """### load_universal across ZeRO stages 1/2 and 3: bare AssertionError

`ds_to_universal` writes each parameter's whole fp32 value and optimizer moments (stage-free),
but copies the saving engine's model-state files as they were named:
`mp_rank_00_model_states.pt` from a ZeRO-1/2 save, `zero_pp_rank_<r>_mp_rank_00_model_states.pt`
from a ZeRO-3 save. `DeepSpeedEngine._get_all_ckpt_names` globs the name of the *loading*
engine's stage, finds nothing, and `SDLoaderFactory.get_sd_loader` fails in
`check_ckpt_list` with `assert len(self.ckpt_list) > 0`, no message:

```python
# 2 ranks, torch.optim.Adam: save under ZeRO-1, make it universal, load under ZeRO-3
engine.save_checkpoint(path, tag="saved")         # ZeRO-1
# python -m deepspeed.checkpoint.ds_to_universal --input_folder path/saved
#     --output_folder path/universal --inject_missing_state
engine3 = deepspeed.initialize(..., config={"zero_optimization": {"stage": 3},
                                             "checkpoint": {"load_universal": True}, ...})
engine3.load_checkpoint(path, tag="universal")    # AssertionError on every rank
```

Expected: a universal checkpoint loads under any stage (the point of making it universal), or
the conversion or the load says which stages it supports.""",
    "nproc": 2,
    "torch_does": "load_checkpoint of a ZeRO-1 save's universal checkpoint under ZeRO-3 raises a "
    "bare AssertionError (state_dict_factory check_ckpt_list) on every rank",
    "spec_says": "a universal checkpoint loads on any data-parallel size and stage with every "
    "parameter's values (FLAT-8)",
    "tests": ["test_zero_checkpoint.py::test_a_universal_checkpoint_loads_across_zero3_and_zero12"],
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
        self.w = torch.nn.Parameter(torch.full((3, 5), fill))

    def forward(self) -> torch.Tensor:
        return self.w.sum()


def engine(stage: int, fill: float, **checkpoint: bool):
    model = One(fill)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": dist.get_world_size(),
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
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
    first = engine(1, 1.0)
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
    second = engine(3, 7.0, load_universal=True)
    try:
        second.load_checkpoint(path, tag="universal")
    except AssertionError as e:
        print(
            f"DIVERGES rank {rank}: deepspeed load_checkpoint under ZeRO-3 of the universal "
            f"checkpoint of a ZeRO-1 save raised AssertionError({str(e)!r}); the spec says it "
            "loads on any data-parallel size and stage with every value (FLAT-8)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
