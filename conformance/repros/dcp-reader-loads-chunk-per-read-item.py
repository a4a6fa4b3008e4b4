"""DCP's FileSystemReader deserialises a whole saved chunk once per read item that cuts it."""

import os
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

DEFECT = {
    "id": "dcp-reader-loads-chunk-per-read-item",
    "title": "DCP FileSystemReader.read_data torch.loads the whole saved chunk once per read item",
    "area": "checkpoint",
    "rule": "CKPT-13",
    "kind": "performance",
    "upstream": "pytorch#169113",
    "nproc": 1,
    "torch_does": "a saved chunk of 8 rows read by 4 read items of 2 rows each is torch.load-ed "
    "4 times, whole: 4x its bytes deserialised to keep a quarter each time",
    "spec_says": "each saved chunk is read at most once per rank per load, and only the bytes "
    "the rank needs",
    "tests": [],
}

loads = 0
real_load = torch.load


def counting_load(*args: object, **kwargs: object) -> object:
    global loads
    loads += 1
    return real_load(*args, **kwargs)


with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "assuming the intent is to ... in a single process"
    saved = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    dcp.save({"t": saved}, checkpoint_id=path, no_dist=True)
    reader = FileSystemReader(path)
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)
    out = {"t": torch.zeros(8, 4)}
    planner = DefaultLoadPlanner()
    planner.set_up_planner(out, md, True)
    # the saved chunk (rows 0-8) cut into 4 read items of 2 rows, as a resharded load does
    chunk = MetadataIndex("t", torch.Size([0, 0]), 0)
    items = [
        ReadItem(
            type=LoadItemType.TENSOR,
            dest_index=MetadataIndex("t", torch.Size([0, 0]), 0),
            dest_offsets=torch.Size([r, 0]),
            storage_index=chunk,
            storage_offsets=torch.Size([r, 0]),
            lengths=torch.Size([2, 4]),
        )
        for r in range(0, 8, 2)
    ]
    torch.load = counting_load  # type: ignore[assignment]
    try:
        reader.read_data(LoadPlan(items), planner).wait()
    finally:
        torch.load = real_load
    assert torch.equal(out["t"], saved), "the load itself went wrong"
    size = os.path.getsize(os.path.join(path, "__0_0.distcp"))
print(f'PERF {{"read_items": 4, "torch_load_calls": {loads}, "chunk_bytes": {size}}}')
if loads > 1:
    print(
        f"DIVERGES rank 0: torch deserialises the 8-row saved chunk {loads} times (once per "
        "read item, each time whole) to fill 4 read items of 2 rows; the spec says each saved "
        "chunk is read at most once per rank per load"
    )
    sys.exit(1)
