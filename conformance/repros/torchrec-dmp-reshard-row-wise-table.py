"""TorchRec cannot move a row_wise table to another plan: DMP.reshard fails on it."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "torchrec-dmp-reshard-row-wise-table",
    "title": "TorchRec has no utility to reshard embedding tables to another plan: "
    "DistributedModelParallel.reshard of a row_wise table fails",
    "area": "torchrec",
    "rule": "TORCHREC-17",
    "upstream": "torchrec#2534",
    "nproc": 2,
    "needs": ["torchrec"],
    "torch_does": "a 7x16 table row_wise over 2 ranks resharded to table_wise on rank 1 with "
    "DistributedModelParallel.reshard: IndexError in create_embedding_bag_sharding on every "
    "rank (its dynamic sharding moves table_wise and column_wise tables only)",
    "spec_says": "resharding a live model to another plan moves every table, whatever its "
    "sharding type, and leaves the reference slices on every rank",
    "tests": [
        "test_torchrec.py::test_torchrec_model_reshard_with_one_hash_seed_holds_the_reference"
    ],
}

if os.environ.get("PYTHONHASHSEED") != "0":
    # one seed on every rank: the tag defect (torchrec-reshard-tags-from-salted-hash) aside
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})

try:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding.dynamic_sharding import output_sharding_plan_delta_single
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
except (ImportError, OSError) as e:
    print(f"SKIPPED torchrec does not load ({type(e).__name__}: {e})")
    sys.exit(0)

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
KEY = "embedding_bags.t.weight"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(2, 2)
        cfg = EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=7, feature_names=["f"])
        self.ebc = EmbeddingBagCollection(tables=[cfg], device=torch.device("meta"))


def plan(generator):
    return construct_module_sharding_plan(
        Model().ebc, {"t": generator}, local_size=2, world_size=2, device_type="cpu"
    )


def table(dmp):  # DMP's .module is the model (unwrapped from DDP in newer TorchRec)
    inner = dmp.module
    return getattr(inner, "module", inner).ebc.state_dict()[KEY]


old, new = plan(row_wise()), plan(table_wise(rank=1))
dmp = DistributedModelParallel(
    Model(),
    env=ShardingEnv.from_process_group(dist.group.WORLD),
    device=torch.device("cpu"),
    plan=ShardingPlan({"ebc": old}),
    sharders=[EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD})],
)
weights = torch.arange(112.0).reshape(7, 16)  # row i holds 16 * i .. 16 * i + 15
with torch.no_grad():
    for s in table(dmp).local_shards():
        r, c = s.metadata.shard_offsets
        s.tensor.copy_(weights[r : r + s.tensor.shape[0], c : c + s.tensor.shape[1]])
try:
    dmp.reshard({"ebc": output_sharding_plan_delta_single(old, new, True)}, "ebc")
except Exception as e:
    print(
        f"DIVERGES rank {rank}: DistributedModelParallel.reshard of a 7x16 row_wise table to "
        f"table_wise on rank 1 failed ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
        "the spec says rank 1 holds the whole table, rows 0-6"
    )
    sys.stdout.flush()
    os._exit(1)
bad = False
for s in table(dmp).local_shards():
    r, c = s.metadata.shard_offsets
    want = weights[r : r + s.tensor.shape[0], c : c + s.tensor.shape[1]]
    if not torch.equal(s.tensor, want):
        bad = True
        print(f"DIVERGES rank {rank}: the piece at {[r, c]} does not hold its rows of the table")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
