"""validate_non_overlapping_shards_metadata accepts the same empty box twice on one rank
(beside a non-empty shard, or when every shard is empty at offset 0)."""

import sys

from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec._internals import (
    validate_non_overlapping_shards_metadata,
)

DEFECT = {
    "id": "validation-duplicate-empty-box-on-one-rank",
    "title": "validate_non_overlapping_shards_metadata accepts one empty box twice on one rank",
    "area": "validation",
    "rule": "LAYOUT-2",
    "upstream": None,
    "issue_text": (
        "## validate_non_overlapping_shards_metadata accepts the same empty shard twice on one "
        "rank, or refuses it, depending on the other shards\n\n"
        "```python\n"
        "from torch.distributed._shard.metadata import ShardMetadata as M\n"
        "from torch.distributed._shard.sharding_spec._internals import (\n"
        "    validate_non_overlapping_shards_metadata as check,\n"
        ")\n\n"
        "twice = [M([2], [0], 'rank:1/cpu')] * 2  # the empty box [2, 2) twice on rank 1\n"
        "check([M([0], [2], 'rank:0/cpu'), *twice])  # passes\n"
        "check(twice)  # ValueError: Shards ... overlap\n"
        "check([M([0], [0], 'rank:0/cpu')] * 2)  # [0, 0) twice on rank 0: passes\n"
        "```\n\n"
        "**Expected**: both refused the same way: one rank listing the same shard twice is a "
        "malformed layout (a copy-paste or a double append), whatever else the layout holds; "
        "and an empty shard never overlaps anything, so an error should name the duplicate, "
        "not an overlap.\n\n"
        "**Actual**: beside a non-empty shard the duplicate passes silently (the sharded-dim "
        "path sorts the empty interval [2, 1] away); alone it is reported as an overlap "
        "(no dim differs between the two shards, so the all-identical branch picks the pair "
        "(0, 1)), unless every shard is empty at offset 0: then the all-zeros branch passes "
        "the layout without reading a placement (a (0, 4) tensor with the box [0, 0) x [0, 4) "
        "on 64 ranks, rank 7's listed twice, passes `check` and `check_tensor`).\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "rows [0, 2) on rank 0 and the empty box [2, 2) listed twice on rank 1 pass; "
    "the same two empty boxes without rank 0's shard are refused as an overlap; [0, 0) twice "
    "on rank 0, every shard empty at offset 0, passes",
    "spec_says": "the same box twice on one rank is an error, with or without other shards",
    "tests": [
        "test_validation.py::test_validator_agrees_with_the_oracle",
        "test_validation.py::test_validator_on_large_layouts_without_elements",
    ],
}


def verdict(shards):
    try:
        validate_non_overlapping_shards_metadata(shards)
    except ValueError:
        return "refused"
    return "accepted"


full = ShardMetadata(shard_offsets=[0], shard_sizes=[2], placement="rank:0/cpu")
twice = [ShardMetadata(shard_offsets=[2], shard_sizes=[0], placement="rank:1/cpu")] * 2
with_full, alone = verdict([full, *twice]), verdict(twice)
print(f"empty box [2, 2) twice on rank 1: {alone} alone, {with_full} beside rows [0, 2)")
bad = False
if with_full == "accepted":
    bad = True
    print(
        f"DIVERGES rank 1: torch accepts [2, 2) twice on rank 1 beside rows [0, 2) (and "
        f"{alone} it alone); the spec says the same box twice on one rank is an error"
    )
# Every shard empty at offset 0 (a tensor of 0 elements): the all-zeros branch, what the
# large-layout test meets with a (0, 4) tensor on 64 ranks and rank 7's box listed twice.
zeros = [ShardMetadata(shard_offsets=[0], shard_sizes=[0], placement="rank:0/cpu")] * 2
if verdict(zeros) == "accepted":
    bad = True
    print(
        "DIVERGES rank 0: torch accepts [0, 0) twice on rank 0 of a tensor of 0 rows; the "
        "spec says the same box twice on one rank is an error"
    )
sys.exit(1 if bad else 0)
