"""TorchRec DMP.reshard receives every column block into a rank's first local shard."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DEFECT = {
    "id": "torchrec-reshard-two-blocks-on-a-rank",
    "title": "TorchRec DistributedModelParallel.reshard of a column_wise table that gives a rank "
    "two column blocks receives both into the rank's first local shard",
    "area": "torchrec",
    "rule": "TORCHREC-17",
    "upstream": None,
    "issue_text": (
        "## `DistributedModelParallel.reshard` of a column_wise table with two blocks on one "
        "rank posts a 0-byte receive\n"
        "\n"
        "`torchrec/distributed/sharding/dynamic_sharding.py` "
        "`_prepare_shard_distribution_comm_ops` receives every incoming column block into "
        "`new_state_dict[...].local_shards()[0].tensor` at a running column offset (its own "
        "TODO: 'assume only one tensor is available'). A column_wise table that gives a rank "
        "two blocks has two local shards, each as wide as one block, so the view for the "
        "second block is empty: gloo aborts the process ('Received data size doesn't match "
        "expected size', 112 vs 0 bytes) and the other rank sees a connection reset.\n"
        "\n"
        "Run with `torchrun --nproc-per-node 2` (gloo, CPU; this file, "
        "`conformance/repros/torchrec-reshard-two-blocks-on-a-rank.py`, is the whole program; "
        "it sets one PYTHONHASHSEED on every rank to sidestep the separate tag defect "
        "`torchrec-reshard-tags-from-salted-hash`): a 7x16 table column_wise over ranks "
        "[1, 0, 1, 0] (4-column blocks) resharded to [0, 1, 0, 1].\n"
        "\n"
        "**Expected**: each rank holds the two blocks the new plan gives it, with their "
        "values.\n"
        "\n"
        "**Actual**: a rank aborts in `batch_isend_irecv`'s wait.\n"
        "\n"
        "Versions: torch 2.13.0 (CPU, gloo), torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0"
    ),
    "nproc": 2,
    "needs": ["torchrec"],
    "torch_does": "a 7x16 table column_wise over ranks [1, 0, 1, 0] resharded to [0, 1, 0, 1]: "
    "each rank posts a 0-byte receive for its second block and gloo aborts",
    "spec_says": "resharding a live model to another plan moves every table and leaves the "
    "reference slices on every rank",
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
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan
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


def plan_on(ranks):
    return construct_module_sharding_plan(
        Model().ebc, {"t": column_wise(ranks=ranks)}, local_size=2, world_size=2, device_type="cpu"
    )


def table(dmp):  # DMP's .module is the model (unwrapped from DDP in newer TorchRec)
    inner = dmp.module
    return getattr(inner, "module", inner).ebc.state_dict()[KEY]


old, new = plan_on([1, 0, 1, 0]), plan_on([0, 1, 0, 1])
dmp = DistributedModelParallel(
    Model(),
    env=ShardingEnv.from_process_group(dist.group.WORLD),
    device=torch.device("cpu"),
    plan=ShardingPlan({"ebc": old}),
    sharders=[EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD})],
)
weights = torch.arange(112.0).reshape(7, 16)  # column j holds values = j (mod 16)
with torch.no_grad():
    for s in table(dmp).local_shards():
        r, c = s.metadata.shard_offsets
        s.tensor.copy_(weights[r : r + s.tensor.shape[0], c : c + s.tensor.shape[1]])
try:
    dmp.reshard({"ebc": output_sharding_plan_delta_single(old, new, True)}, "ebc")
except Exception as e:
    print(
        f"DIVERGES rank {rank}: DistributedModelParallel.reshard of a 7x16 column_wise table "
        f"from ranks [1, 0, 1, 0] to [0, 1, 0, 1] failed ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:160]}); the spec says each rank holds its two new blocks"
    )
    sys.stdout.flush()
    os._exit(1)
bad = False
for s in table(dmp).local_shards():
    r, c = s.metadata.shard_offsets
    want = weights[r : r + s.tensor.shape[0], c : c + s.tensor.shape[1]]
    if not torch.equal(s.tensor, want):
        bad = True
        print(f"DIVERGES rank {rank}: the block at column {c} does not hold columns {c}-{c + 3}")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
