"""TorchRec's load_state_dict between two plans copies shards by position, not by offset."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "torchrec-load-state-dict-between-plans",
    "title": "TorchRec load_state_dict from a model of another plan silently loads wrong values "
    "when the local shard shapes match",
    "area": "torchrec",
    "rule": "TORCHREC-18",
    "upstream": None,
    "issue_text": (
        "## `load_state_dict` between two sharding plans silently loads wrong values when "
        "local shard shapes match\n"
        "\n"
        "Run with `torchrun --nproc-per-node 2` (gloo, CPU):\n"
        "\n"
        "```python\n"
        "import torch, torch.distributed as dist\n"
        "from torchrec import EmbeddingBagCollection, EmbeddingBagConfig\n"
        "from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder\n"
        "from torchrec.distributed.shard import shard\n"
        "from torchrec.distributed.sharding_plan import column_wise, "
        "construct_module_sharding_plan\n"
        "from torchrec.distributed.types import ShardingEnv\n"
        "\n"
        'dist.init_process_group("gloo")\n'
        'key = "embedding_bags.t.weight"\n'
        "\n"
        "def sharded(ranks):\n"
        '    cfg = EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=3, '
        'feature_names=["f"])\n'
        '    ebc = EmbeddingBagCollection(tables=[cfg], device=torch.device("meta"))\n'
        "    plan = construct_module_sharding_plan(\n"
        '        ebc, {"t": column_wise(ranks=ranks)}, local_size=2, world_size=2, '
        'device_type="cpu"\n'
        "    )\n"
        "    env = ShardingEnv.from_process_group(dist.group.WORLD)\n"
        '    return shard(ebc, plan, env, torch.device("cpu"), '
        "EmbeddingBagCollectionSharder())\n"
        "\n"
        "weights = torch.arange(24.0).reshape(3, 8)\n"
        "src, dst = sharded([0, 1]), sharded([1, 0])  # the same table, column blocks on "
        "swapped ranks\n"
        "with torch.no_grad():\n"
        "    for s in src.state_dict()[key].local_shards():\n"
        "        r, c = s.metadata.shard_offsets\n"
        "        s.tensor.copy_(weights[r : r + 3, c : c + 4])\n"
        "dst.load_state_dict(src.state_dict())  # no error\n"
        "for s in dst.state_dict()[key].local_shards():\n"
        "    print(dist.get_rank(), s.metadata.shard_offsets, s.tensor[0].tolist())\n"
        "# rank 0 [0, 4] [0.0, 1.0, 2.0, 3.0]   <- columns 0-3 stored where columns 4-7 "
        "belong\n"
        "# rank 1 [0, 0] [4.0, 5.0, 6.0, 7.0]\n"
        "```\n"
        "\n"
        "**Expected**: either the values end up at the offsets the destination plan states "
        "(rank 0's shard at column 4 holds columns 4-7), or `load_state_dict` refuses, on "
        "every rank, because the source shards' offsets differ from the destination's.\n"
        "\n"
        "**Actual**: the local shards are copied by position; since the shapes match (3x4 on "
        "both ranks) nothing complains and every rank silently holds the other block's "
        "columns. Between plans whose shapes differ the same call raises a size mismatch "
        "instead. TorchRec has no utility to move tables between plans (torchrec#2534), so "
        "`load_state_dict` is what users reach for.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo), torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0"
    ),
    "nproc": 2,
    "needs": ["torchrec"],
    "torch_does": "a 3x8 table column_wise over ranks [0, 1] loaded into the same table "
    "column_wise over ranks [1, 0]: rank 0 holds columns 4-7 but is given columns 0-3, "
    "with no error",
    "spec_says": "loading shards into a model whose layout differs is refused on every rank "
    "before anything is copied (or the values are moved to where the new plan puts them)",
    "tests": [],
}

try:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv
except (ImportError, OSError) as e:  # OSError: fbgemm-gpu built for another torch
    print(f"SKIPPED torchrec does not load ({type(e).__name__}: {e})")
    sys.exit(0)

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
weights = torch.arange(24.0).reshape(3, 8)  # element (i, j) holds 8 * i + j: column j is v % 8
key = "embedding_bags.t.weight"


def sharded(ranks):
    cfg = EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=3, feature_names=["f"])
    ebc = EmbeddingBagCollection(tables=[cfg], device=torch.device("meta"))
    plan = construct_module_sharding_plan(
        ebc, {"t": column_wise(ranks=ranks)}, local_size=2, world_size=2, device_type="cpu"
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    return shard(ebc, plan, env, torch.device("cpu"), EmbeddingBagCollectionSharder())


def local(model):  # (offsets, tensor) of each local shard, as TorchRec states them
    return [(s.metadata.shard_offsets, s.tensor) for s in model.state_dict()[key].local_shards()]


src, dst = sharded([0, 1]), sharded([1, 0])
with torch.no_grad():
    for (r0, c0), t in local(src):
        t.copy_(weights[r0 : r0 + t.shape[0], c0 : c0 + t.shape[1]])
    for _, t in local(dst):
        t.fill_(-1.0)
try:
    dst.load_state_dict(src.state_dict())
except Exception as e:  # refused: the spec's answer (TORCHREC-18)
    print(f"rank {rank}: refused ({type(e).__name__}: {str(e)[:200]})")
    dist.barrier()
    sys.exit(0)
bad = False
for (r0, c0), t in local(dst):
    n, w = t.shape
    got_cols = sorted({int(v) % 8 for v in t.flatten().tolist()})
    box = [[r0, c0], [n, w]]
    held = [[r0, got_cols[0]], [n, len(got_cols)]]
    print("BOXES", json.dumps({"rank": rank, "shape": [3, 8], "spec": [box], "torch": [held]}))
    if not torch.equal(t, weights[r0 : r0 + n, c0 : c0 + w]):
        bad = True
        print(
            f"DIVERGES rank {rank}: after load_state_dict the shard TorchRec states at columns "
            f"{c0}-{c0 + w - 1} holds columns {got_cols} ({t[0].tolist()} in row 0); the spec "
            "says a load between plans is refused (or moves the values): silent wrong values"
        )
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
