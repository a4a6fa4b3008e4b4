"""validate_non_overlapping_shards_metadata's verdict on two identical empty boxes depends on a
third shard."""

import json
import sys

from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec._internals import (
    validate_non_overlapping_shards_metadata,
)

DEFECT = {
    "id": "validation-identical-empty-boxes-need-a-third",
    "title": "validate_non_overlapping_shards_metadata flags two identical empty boxes as "
    "overlapping only when a third shard is present",
    "area": "validation",
    "rule": "BOX-2",
    "upstream": None,
    "issue_text": (
        "## validate_non_overlapping_shards_metadata's verdict on two identical empty shards "
        "depends on a third shard\n\n"
        "```python\n"
        "from torch.distributed._shard.metadata import ShardMetadata as M\n"
        "from torch.distributed._shard.sharding_spec._internals import (\n"
        "    validate_non_overlapping_shards_metadata as check,\n"
        ")\n\n"
        "# a (1, 0) tensor: the same empty box on ranks 0 and 1 (replicas)\n"
        "pair = [M([0, 0], [1, 0], 'rank:0/cpu'), M([0, 0], [1, 0], 'rank:1/cpu')]\n"
        "check(pair)  # passes\n"
        "check([*pair, M([0, 0], [0, 0], 'rank:0/cpu')])  # ValueError: Shards ... overlap\n"
        "```\n\n"
        "**Expected**: both pass. Every shard is empty, so nothing can overlap; adding a third "
        "empty shard cannot create an overlap between the first two.\n\n"
        "**Actual**: the pair alone passes (no dim differs and all offsets are 0, the "
        "all-zeros branch); with the third shard dim 0 differs, `_find_1d_overlapping_shards` "
        "runs on inclusive intervals, and the two identical empty shards [0, 0] are reported "
        "as overlapping each other. Conversely, two identical empty shards at a non-zero "
        "offset (`M([2], [0], ...)` on ranks 1 and 2 of a 2-row tensor) are refused alone and "
        "accepted once a non-empty shard `M([0], [2], 'rank:0/cpu')` is added.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "a (1, 0) tensor: [0,0]+[1,0] on ranks 0 and 1 passes; adding the empty "
    "[0,0]+[0,0] on rank 0 makes torch call the first two an overlap",
    "spec_says": "empty boxes overlap nothing: the layout is valid with or without the third shard",
    "tests": [
        "test_validation.py::test_validator_agrees_with_the_oracle",
        "test_validation.py::test_validator_accepts_every_valid_layout",
    ],
}


def md(sizes, rank):
    return ShardMetadata(shard_offsets=[0, 0], shard_sizes=sizes, placement=f"rank:{rank}/cpu")


pair = [md([1, 0], 0), md([1, 0], 1)]  # the same empty box on two ranks: replicas
third = md([0, 0], 0)
for r in (0, 1):
    boxes = [[m.shard_offsets, m.shard_sizes] for m in [*pair, third] if m.placement.rank() == r]
    print("BOXES", json.dumps({"rank": r, "shape": [1, 0], "spec": boxes, "torch": boxes}))
verdicts = []
for shards in (pair, [*pair, third]):
    try:
        validate_non_overlapping_shards_metadata(shards)
        verdicts.append("accepted")
    except ValueError as e:
        verdicts.append(f"refused ({e})")
print(f"two shards: {verdicts[0]}; with the third: {verdicts[1]}")
if verdicts != ["accepted", "accepted"]:
    print(
        f"DIVERGES rank 0: torch says the pair alone is {verdicts[0].split()[0]} but with an "
        f"empty third shard {verdicts[1]}; the spec says empty boxes overlap nothing"
    )
    sys.exit(1)
