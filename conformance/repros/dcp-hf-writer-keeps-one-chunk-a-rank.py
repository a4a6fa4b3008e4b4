"""DCP's Hugging Face writer keeps one chunk of a tensor a rank: a rank holding two chunks
writes one, and the reader loads the rest without a word."""

import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

DEFECT = {
    "id": "dcp-hf-writer-keeps-one-chunk-a-rank",
    "title": "HuggingFaceStorageWriter drops all but one chunk of a tensor on a rank",
    "area": "collective_load",
    "rule": "CKPT-28",
    "upstream": None,
    "issue_text": (
        "## DCP: HuggingFaceStorageWriter loses chunks when a rank holds several\n\n"
        "A ShardedTensor of `arange(8)` with rows 0-1 and 4-5 on rank 0 and rows 2-3 and 6-7 "
        "on rank 1 (several shards a rank, as TorchRec's and row-wise plans make), saved with "
        "`HuggingFaceStorageWriter(path, save_distributed=True)`, then loaded with "
        "`HuggingFaceStorageReader`.\n\n"
        "**Expected**: the save keeps every chunk, or refuses; a load of what was written "
        "gives `arange(8)` or raises.\n\n"
        "**Actual**: each rank's file holds one tensor `t` (the writer's `tensor_dict` and "
        "`DCP_SHARDING_INFO` are keyed by name, so the last chunk replaces the first), and "
        "the load returns with rows 0-3 keeping what the destination held.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 2,
    "torch_does": "writes one of each rank's two chunks of arange(8) and loads the rest: rows "
    "0-3 keep -1",
    "spec_says": "what the format holds is read only when its chunks fill the tensor; "
    "otherwise the load is refused on every rank (CKPT-28)",
    "tests": [
        "test_checkpoint_collective_load.py::"
        "test_dcps_hugging_face_format_of_several_chunks_a_rank_loads_or_fails_on_every_rank"
    ],
}

warnings.simplefilter("ignore")
dist.init_process_group("gloo")
rank = dist.get_rank()
box = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(box)
path = box[0]
full = torch.arange(8, dtype=torch.float32)
shards = [
    Shard(full[o : o + 2].clone(), ShardMetadata([o], [2], f"rank:{rank}/cpu"))
    for o in ([0, 4] if rank == 0 else [2, 6])
]
saved = init_from_local_shards(shards, [8])
dcp.save({"t": saved}, storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
dist.barrier()
target = torch.full((8,), -1.0)
try:
    dcp.load({"t": target}, storage_reader=HuggingFaceStorageReader(path))
except BaseException as e:  # DCP's CheckpointException is a BaseException
    print(f"refused: {type(e).__name__}")
    dist.destroy_process_group()
    sys.exit(0)
dist.destroy_process_group()
if torch.equal(target, full):
    sys.exit(0)
print(
    f"DIVERGES rank {rank}: torch saves arange(8) (two chunks a rank) and loads it as "
    f"{target.tolist()}; the spec says the load gives arange(8) or is refused on every rank"
)
sys.exit(1)
