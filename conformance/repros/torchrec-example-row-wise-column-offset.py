"""PyTorch's TorchRec sharding example states row-wise shards at column offset 16, not 0.

The example is not in the wheel, so this repro restates its offset expression (the one line
marked below) and lets DCP judge the chunks it produces: when the example is fixed, change that
line to the example's new expression and the repro exits 0.
"""

import sys

import torch
from torch.distributed.checkpoint.default_planner import _validate_global_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

DEFECT = {
    "id": "torchrec-example-row-wise-column-offset",
    "title": "torch/distributed/tensor/examples/torchrec_sharding_example.py gives row-wise "
    "shards the column offset embedding_dim (16) instead of 0",
    "area": "torchrec",
    "rule": "LAYOUT-1",
    "upstream": None,
    "nproc": 1,
    "torch_does": "run_torchrec_row_wise_even_sharding_example offsets rank r's (2, 16) shard of "
    "an (8, 16) table at (2r, 16): every chunk lies outside the table, and the example's own "
    "asserts check the wrong offset back",
    "spec_says": "row-wise shards keep every column: rank r's box is rows [2r, 2r + 2), columns "
    "[0, 16), offset (2r, 0)",
    "tests": [],
    "issue_text": """### torchrec_sharding_example.py: row-wise shards get column offset 16

`torch/distributed/tensor/examples/torchrec_sharding_example.py`,
`run_torchrec_row_wise_even_sharding_example`, builds each rank's shard offset as
`torch.Size((rank * 2, embedding_dim))`. For an (8, 16) table sharded by rows over 4 ranks,
rank r holds rows [2r, 2r + 2) and all 16 columns, so its offset is (2r, 0); (2r, 16) places
every chunk wholly outside the table. The wrapper turns these offsets into DCP
`ChunkStorageMetadata`, so a checkpoint saved this way would describe no element of the table,
and DCP's own plan validation reports every chunk out of bounds. The example's assert compares
the offset with the same wrong value, so it passes. The uneven example
(`rank // 2 * 4 + rank % 2 * 1, embedding_dim`) has the same column offset.

Expected: offsets (2r, 0). Seen on main (the file is not shipped in the wheel); torch 2.13.0.
""",
}

rows, cols, world = 8, 16, 4  # the example's table and world size
chunks = []
for rank in range(world):
    as_in_example = torch.Size((rank * 2, cols))  # <- the example's expression (embedding_dim)
    chunks.append(ChunkStorageMetadata(as_in_example, torch.Size((rows // world, cols))))
    print(f"rank {rank}: example offset {tuple(as_in_example)}; the spec says ({rank * 2}, 0)")
table = TensorStorageMetadata(
    TensorProperties(dtype=torch.float32), torch.Size((rows, cols)), chunks
)
errors = _validate_global_plan([], Metadata(state_dict_metadata={"table": table}))
if errors:
    print(f"DIVERGES: DCP's own validation refuses the example's chunks: {errors[0]}")
    sys.exit(1)
