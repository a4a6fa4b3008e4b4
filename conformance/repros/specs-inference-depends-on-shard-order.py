"""_infer_sharding_spec_from_shards_metadata answers differently for two orders of one layout."""

import sys

from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.distributed._shard.sharding_spec.api import _infer_sharding_spec_from_shards_metadata

DEFECT = {
    "id": "specs-inference-depends-on-shard-order",
    "title": "_infer_sharding_spec_from_shards_metadata depends on the order of the shards",
    "area": "specs",
    "rule": "SPEC-5",
    "upstream": None,
    "issue_text": (
        "## `_infer_sharding_spec_from_shards_metadata` depends on the order of the shards\n"
        "\n"
        "```python\n"
        "from torch.distributed._shard.metadata import ShardMetadata as M\n"
        "from torch.distributed._shard.sharding_spec.api import (\n"
        "    _infer_sharding_spec_from_shards_metadata as infer,\n"
        ")\n"
        "\n"
        'a = M([1, 0, 0], [0, 1, 0], "rank:0/cpu")  # cut along dim 0\n'
        'b = M([0, 1, 0], [1, 0, 0], "rank:1/cpu")  # cut along dim 1\n'
        "print(infer([a, b]))  # ChunkShardingSpec(dim=1, ...)\n"
        "print(infer([b, a]))  # EnumerableShardingSpec(...)\n"
        "```\n"
        "\n"
        "**Expected**: the same spec for both orders (Enumerable: the shards are cut along "
        "two dims, no chunking gives them). The order of a shard list is an artefact of "
        "whoever built it (an all_gather, a checkpoint's metadata), so "
        "`ShardedTensor._init_from_local_shards_and_global_metadata` should not pick a "
        "different spec because of it.\n"
        "\n"
        '**Actual**: the loop uses `if not chunk_sharding_dim:` to mean "not set yet", so a '
        "dim-0 shard seen first leaves it unset and a later dim-1 shard sets it to 1; in the "
        "other order dim 1 is set first and the dim-0 shard is seen as a second dim. `if "
        "chunk_sharding_dim is None:` fixes it. (Related: the chunk check expects empty "
        "chunks at `split * i`, past the end, as `build_metadata` writes them, so a chunk "
        "layout whose empty chunk sits at the dim size is inferred Enumerable.)\n"
        "\n"
        "Versions: torch 2.13.0 (CPU)"
    ),
    "nproc": 1,
    "torch_does": "a (1, 1, 0) tensor, A=[1,0,0]+[0,1,0] on rank 0 and B=[0,1,0]+[1,0,0] on "
    "rank 1: the order A, B infers a ChunkShardingSpec on dim 1, the order B, A an "
    "EnumerableShardingSpec",
    "spec_says": "inference reads only the set of (box, rank): every order gives the same spec "
    "(here Enumerable: no chunking gives this layout)",
    "tests": [
        "test_specs.py::test_inference_does_not_depend_on_shard_order",
        "test_specs.py::test_inferred_spec_is_chunk_exactly_when_a_chunking_gives_the_layout",
        "test_specs.py::test_inferred_spec_gives_back_the_layout_ranks_included",
        "test_specs.py::test_torch_sharding_spec_says_the_layout_ranks_included",
    ],
}

# Shard A is cut along dim 0 (offset 1 there), shard B along dim 1; both are empty.
a = ShardMetadata(shard_offsets=[1, 0, 0], shard_sizes=[0, 1, 0], placement="rank:0/cpu")
b = ShardMetadata(shard_offsets=[0, 1, 0], shard_sizes=[1, 0, 0], placement="rank:1/cpu")


def infer(shards):
    spec = _infer_sharding_spec_from_shards_metadata(shards)
    if isinstance(spec, ChunkShardingSpec):
        return f"ChunkShardingSpec(dim={spec.dim})"
    return type(spec).__name__


ab, ba = infer([a, b]), infer([b, a])
print(f"order A, B: {ab}; order B, A: {ba}")
if ab != ba:
    print(
        f"DIVERGES rank 0: the same two shards infer {ab} in the order A, B and {ba} in the "
        "order B, A (dim 0 is read as 'unset': `if not chunk_sharding_dim`); the spec says "
        "the order of the shards does not matter"
    )
    sys.exit(1)
