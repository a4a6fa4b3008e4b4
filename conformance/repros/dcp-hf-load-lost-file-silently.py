"""DCP's Hugging Face format loads with one rank's file lost: the reader takes the tensor's
shape from the chunks it finds and never checks that they fill it, so the lost rows keep what
the destination held."""

import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

DEFECT = {
    "id": "dcp-hf-load-lost-file-silently",
    "title": "HuggingFaceStorageReader loads a sharded checkpoint with a rank's file lost",
    "area": "collective_load",
    "rule": "CKPT-28",
    "upstream": None,
    "issue_text": (
        "## DCP: a distributed Hugging Face checkpoint with a file lost loads silently\n\n"
        "Save a DTensor `arange(4)` sharded on 2 ranks with "
        "`HuggingFaceStorageWriter(path, save_distributed=True)` (one "
        "`shard-0000R-model-00001-of-00001.safetensors` a rank, each placing its chunk in "
        "`__metadata__['DCP_SHARDING_INFO']`), delete rank 0's file, and `dcp.load` into a "
        "tensor of -1 with `HuggingFaceStorageReader(path)`.\n\n"
        "**Expected**: the load raises on every rank: rows 0-1 are in no chunk.\n\n"
        "**Actual**: it returns; rows 0-1 are still -1. `read_metadata` takes each tensor's "
        "size as the maximum of its chunks' ends (the format stores no global shape) and "
        "nothing checks that the chunks cover that box, so a lost file inside it is a silent "
        "hole (a lost file at its end is a size mismatch, which is refused).\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 2,
    "torch_does": "loads arange(4) saved on 2 ranks with rank 0's file deleted: rows 0-1 keep "
    "-1, and the load returns",
    "spec_says": "chunks that leave an element of their bounding box unheld are refused on "
    "every rank before any read (CKPT-28)",
    "tests": [
        "test_checkpoint_collective_load.py::"
        "test_dcps_hugging_face_format_loads_the_reference_or_fails_on_every_rank"
    ],
}

warnings.simplefilter("ignore")
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
box = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(box)
path = box[0]
saved = distribute_tensor(torch.arange(4, dtype=torch.float32), mesh, [Shard(0)])
dcp.save({"t": saved}, storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
dist.barrier()
if rank == 0:
    os.remove(os.path.join(path, "shard-00001-model-00001-of-00001.safetensors"))
dist.barrier()
target = torch.full((4,), -1.0)
try:
    dcp.load({"t": target}, storage_reader=HuggingFaceStorageReader(path))
except BaseException as e:  # DCP's CheckpointException is a BaseException
    print(f"refused: {type(e).__name__}")
    dist.destroy_process_group()
    sys.exit(0)
dist.destroy_process_group()
print(
    f"DIVERGES rank {rank}: torch loads arange(4) with rank 0's file deleted as "
    f"{target.tolist()} (rows 0-1 in no file); the spec says the load is refused on every rank"
)
sys.exit(1)
