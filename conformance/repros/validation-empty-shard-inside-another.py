"""validate_non_overlapping_shards_metadata calls a zero-size shard inside another an overlap."""

import json
import sys

from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec._internals import (
    validate_non_overlapping_shards_metadata,
)

DEFECT = {
    "id": "validation-empty-shard-inside-another",
    "title": "validate_non_overlapping_shards_metadata reports an empty shard inside another as "
    "an overlap",
    "area": "validation",
    "rule": "BOX-2",
    "upstream": None,
    "issue_text": (
        "## validate_non_overlapping_shards_metadata reports an empty shard inside another "
        "shard as an overlap\n\n"
        "```python\n"
        "from torch.distributed._shard.metadata import ShardMetadata\n"
        "from torch.distributed._shard.sharding_spec._internals import (\n"
        "    validate_non_overlapping_shards_metadata,\n"
        ")\n\n"
        "validate_non_overlapping_shards_metadata([\n"
        "    ShardMetadata([0], [2], 'rank:0/cpu'),  # rows [0, 2)\n"
        "    ShardMetadata([1], [0], 'rank:1/cpu'),  # an empty box at offset 1\n"
        "])\n"
        "```\n\n"
        "**Expected**: no error. A shard with a zero size holds no element, so it cannot "
        "overlap anything, wherever its offset lies (empty shards are routine with more ranks "
        "than rows).\n\n"
        "**Actual**: `ValueError: Shards ShardMetadata(shard_offsets=[0], shard_sizes=[2], ...) "
        "and ShardMetadata(shard_offsets=[1], shard_sizes=[0], ...) overlap`. "
        "`_check_shard_metadata_pair_overlap` compares offsets only and never asks whether "
        "either box is empty; the 1-D path (`_find_1d_overlapping_shards`) gives the empty "
        "shard the interval [1, 0] and still reports it. The same holds in N-D, e.g. "
        "`[2,2)x[2,4)` inside `[0,4)x[0,4)`.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "rows [0, 2) on rank 0 and the empty box [1, 1) on rank 1 of a 2-row tensor "
    "raise 'Shards ... overlap'",
    "spec_says": "an empty box holds nothing and overlaps nothing, wherever its offset lies",
    "tests": [
        "test_validation.py::test_empty_shard_inside_another_is_not_an_overlap",
        "test_validation.py::test_validator_accepts_every_large_grid",
        "test_validation.py::test_validator_agrees_with_the_oracle_on_large_chunkings",
    ],
}

# A 2-row tensor: rank 0 holds both rows, rank 1 an empty box whose offset lies inside them.
shards = [
    ShardMetadata(shard_offsets=[0], shard_sizes=[2], placement="rank:0/cpu"),
    ShardMetadata(shard_offsets=[1], shard_sizes=[0], placement="rank:1/cpu"),
]
for r, md in enumerate(shards):
    box = [[md.shard_offsets, md.shard_sizes]]
    print("BOXES", json.dumps({"rank": r, "shape": [2], "spec": box, "torch": box}))
try:
    validate_non_overlapping_shards_metadata(shards)
except ValueError as e:
    print(
        f"DIVERGES rank 1: torch refuses the layout: {e}; the spec says an empty box "
        "overlaps nothing"
    )
    sys.exit(1)
