"""Refit a small Llama-like model from 2 training ranks (FSDP2's dim-0 chunks) into 2 serving
ranks (vLLM's TP 2: packed qkv and gate_up, padded vocabulary), and check every serving rank
against the single-process reference.

torchrun --nproc-per-node 4 examples/refit_train_to_serve.py
"""

import torch
import torch.distributed as dist

from shardspec.metadata import Layout, chunk_layout
from shardspec.refit import packed_layout, reference, refit
from shardspec.refit.models import dense_to_vllm

dist.init_process_group("gloo")
rank = dist.get_rank()
TRAIN, SERVE = [0, 1], [2, 3]

# 2 layers, hidden 6, 3 query heads and 1 kv head of 2 rows (GQA 3), MLP 5, vocabulary 11
hidden, hd, q_heads, kv_heads, inter, vocab = 6, 2, 3, 1, 5, 11
recipe = dense_to_vllm(2, vocab, padded=12)  # vLLM pads the vocabulary: 12 rows over TP 2


def hf_shape(name: str) -> tuple[int, ...]:
    """Each Hugging Face tensor's shape."""
    q, kv = q_heads * hd, kv_heads * hd
    for end, shape in [
        ("q_proj.weight", (q, hidden)),
        ("k_proj.weight", (kv, hidden)),
        ("v_proj.weight", (kv, hidden)),
        ("o_proj.weight", (hidden, q)),
        ("gate_proj.weight", (inter, hidden)),
        ("up_proj.weight", (inter, hidden)),
        ("down_proj.weight", (hidden, inter)),
        ("embed_tokens.weight", (vocab, hidden)),
        ("lm_head.weight", (vocab, hidden)),
    ]:
        if name.endswith(end):
            return shape
    return (hidden,)  # the norms


def serving_layout(name: str) -> Layout:
    """vLLM's TP 2: column-parallel packed parts (whole heads), row-parallel o/down projections,
    the padded vocabulary by rows, norms on every serving rank."""
    q, kv = q_heads * hd, kv_heads * hd
    if name.endswith("qkv_proj.weight"):
        return packed_layout((q + 2 * kv, hidden), 0, [q, kv, kv], SERVE, unit=hd)
    if name.endswith("gate_up_proj.weight"):
        return packed_layout((2 * inter, hidden), 0, [inter, inter], SERVE)
    if name.endswith("o_proj.weight"):
        return chunk_layout((hidden, q), 1, SERVE)
    if name.endswith("down_proj.weight"):
        return chunk_layout((hidden, inter), 1, SERVE)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return chunk_layout((12, hidden), 0, SERVE)
    return Layout.replicated((hidden,), SERVE)


# Every rank builds the same full weights (the same seed) only to check the answer; each
# training rank keeps its own chunks, as FSDP2 holds them.
torch.manual_seed(0)
full = {n: torch.randn(hf_shape(n), dtype=torch.bfloat16) for n in recipe.sources()}
src = {n: chunk_layout(t.shape, 0, TRAIN) for n, t in full.items()}
dst = {t.name: serving_layout(t.name) for t in recipe.targets}
state = {n: [t[b.slices()].clone() for b in src[n].boxes_of(rank)] for n, t in full.items()}
state = {n: v for n, v in state.items() if v}

mine = refit(recipe, state, src, dst)  # every rank calls it, training and serving alike

shards = {
    n: {r: [t[b.slices()] for b in src[n].boxes_of(r)] for r in TRAIN} for n, t in full.items()
}
want = reference.refit(recipe, shards, src, dst)
for name, by_rank in want.items():
    got = mine.get(name, [])
    expected = by_rank.get(rank, [])
    assert len(got) == len(expected), (rank, name)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
if rank in SERVE:
    held = sum(len(by_rank.get(rank, [])) for by_rank in want.values())
    print(f"rank {rank}: {held} serving tensors equal the reference bit for bit")
dist.barrier()  # no rank tears gloo down while a peer is still sending
dist.destroy_process_group()
