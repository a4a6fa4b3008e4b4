"""DCP's default load planner reads a damaged checkpoint without a word: a tensor whose saved
chunks leave a gap loads, and the elements no chunk holds keep what the tensor held before."""

import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

DEFECT = {
    "id": "dcp-load-damaged-checkpoint-silently",
    "title": "DCP's default load planner loads a checkpoint whose chunks leave a gap or overlap",
    "area": "checkpoint",
    "rule": "CKPT-1",
    "upstream": None,
    "issue_text": (
        "## DCP: loading a checkpoint whose chunks do not tile the tensor succeeds silently\n\n"
        "A (4, 2) tensor whose only saved chunk covers rows [0, 3) (a truncated or hand-edited "
        "`.metadata`) loads with `DefaultLoadPlanner`: row 3 keeps whatever the destination "
        "held. Chunks that overlap, or one chunk saved twice, load too (the later read wins). "
        "`_validate_global_plan` checks chunks at save time only; `create_local_plan` / "
        "`create_read_items_for_chunk_list` check nothing.\n\n"
        "**Expected**: the load raises, naming the tensor, before any read.\n\n"
        "**Actual**: it returns; the tensor holds stale values where no chunk reached.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "loads a (4, 2) tensor from one saved chunk of rows [0, 3): row 3 keeps its "
    "old value -1",
    "spec_says": "a checkpoint whose chunks leave a gap is refused before any read (CKPT-1)",
    "tests": [
        "test_checkpoint_load.py::"
        "test_a_load_through_the_planner_fills_a_valid_checkpoint_and_refuses_a_damaged_one",
        "test_checkpoint_collective_load.py::"
        "test_a_collective_load_refuses_a_chunk_list_with_a_gap_or_an_overlap_on_every_rank",
    ],
}

saved = torch.arange(8, dtype=torch.float32).reshape(4, 2)
chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([3, 2]))
md = Metadata(
    {"t": TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([4, 2]), [chunk])}
)


class Memory(StorageReader):
    """The checkpoint above, in memory: chunk 0 holds rows [0, 3) of ``saved``."""

    def reset(self, checkpoint_id=None):
        pass

    def read_metadata(self, *args, **kwargs):
        return md

    def set_up_storage_reader(self, metadata, is_coordinator, **kwargs):
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        for item in plan.items:
            start = [a + b for a, b in zip(item.storage_index.offset, item.storage_offsets)]
            region = tuple(slice(a, a + n) for a, n in zip(start, item.lengths))
            dst = planner.resolve_tensor(item).detach()
            dst.copy_(saved[region])
            planner.commit_tensor(item, dst)
        done = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return True


target = torch.full((4, 2), -1.0)
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"t": target}, storage_reader=Memory(), planner=DefaultLoadPlanner(), no_dist=True)
except BaseException as e:  # CheckpointException is a BaseException
    print(f"refused: {type(e).__name__}")
    sys.exit(0)
print(
    f"DIVERGES rank 0: torch loads the checkpoint; row 3 is {target[3].tolist()} (no chunk "
    "holds it); the spec says a checkpoint whose chunks leave a gap is refused before any read"
)
sys.exit(1)
