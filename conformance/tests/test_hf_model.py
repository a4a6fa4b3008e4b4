"""A model library's distributed loading and saving (the hf_model area): a Llama-style model
in one safetensors file, loaded over tensor-parallel and FSDP meshes, each rank's shard is its
placements' slice of the file's tensor (DTENSOR-1, -2, -4) and the ranks together hold every
element; saved as a distributed checkpoint or as consolidated safetensors on one mesh and
loaded on another, the same (CKPT-20).

Answered by transformers (``SHARDSPEC_IMPL=transformers``, ``nox -s peers_transformers``);
shardspec and torch have no model loader, so they report this area unsupported."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from conformance import reference
from conformance.assertions import assert_tensor_bitwise
from conformance.cases import case
from conformance.impls import Impl

# tensor parallel over 4, FSDP over 4, and 2 x 2 (the meshes the library's own tests use)
MESHES = [{"tp": 4, "fsdp": 1}, {"tp": 1, "fsdp": 4}, {"tp": 2, "fsdp": 2}]
HIDDEN, HEADS, KV_HEADS = 16, 4, 2


def llama(vocab: int, intermediate: int) -> dict[str, Any]:
    """A one-layer Llama-style model: its config's fields and every weight, each element a
    distinct float (its index plus 1000 x the weight's number), exact in fp32."""
    kv = KV_HEADS * (HIDDEN // HEADS)
    shapes = {
        "model.embed_tokens.weight": (vocab, HIDDEN),
        "model.layers.0.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "model.layers.0.self_attn.k_proj.weight": (kv, HIDDEN),
        "model.layers.0.self_attn.v_proj.weight": (kv, HIDDEN),
        "model.layers.0.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "model.layers.0.mlp.gate_proj.weight": (intermediate, HIDDEN),
        "model.layers.0.mlp.up_proj.weight": (intermediate, HIDDEN),
        "model.layers.0.mlp.down_proj.weight": (HIDDEN, intermediate),
        "model.layers.0.input_layernorm.weight": (HIDDEN,),
        "model.layers.0.post_attention_layernorm.weight": (HIDDEN,),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (vocab, HIDDEN),
    }
    weights = {
        name: (torch.arange(torch.Size(s).numel(), dtype=torch.float32) + 1000 * i).reshape(s)
        for i, (name, s) in enumerate(shapes.items())
    }
    config = {
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 32,
        "tie_word_embeddings": False,
    }
    return {"config": config, "weights": weights}


def _mesh(m: dict[str, int]) -> str:
    return f"tp {m['tp']} x fsdp {m['fsdp']}"


def check_shards(
    got: dict[int, dict[str, dict[str, Any]]],
    weights: dict[str, torch.Tensor],
    world: int,
    ex: str,
) -> None:
    """Each rank's shard of each weight is its placements' slice of the weight (the
    reference's DTensor indices), and the ranks together hold every element."""
    if sorted(got) != list(range(world)):
        raise AssertionError(f"ranks {sorted(got)} answered, {world} loaded [{ex}]")
    for name, full in weights.items():
        ids = torch.arange(full.numel()).reshape(full.shape)
        held = torch.zeros(full.numel(), dtype=torch.bool)
        for r in range(world):
            if name not in got[r]:
                raise AssertionError(f"rank {r}: {name} not loaded [{ex}]")
            shard = got[r][name]
            idx = shard_indices(shard, full.shape)
            held[reference.gather(ids, idx).reshape(-1)] = True
            where = f"rank {r} {name} (placements {shard['placements']} on mesh {shard['mesh']})"
            assert_tensor_bitwise(where, shard["local"], reference.gather(full, idx), ex,
                                  "DTENSOR-4")  # fmt: skip
        if not bool(held.all()):
            lost = int((~held).sum())
            raise AssertionError(
                f"{name}: {lost} of {held.numel()} elements held by no rank (DTENSOR-1) [{ex}]"
            )


def shard_indices(shard: dict[str, Any], shape: Sequence[int]) -> list[list[int]]:
    """The indices of a rank's shard of a tensor of ``shape``, per dim: its placements' (the
    reference's DTensor indices), or every index where it is not distributed."""
    if not shard["mesh"]:
        return [list(range(n)) for n in shape]
    return reference.dtensor_indices(shape, shard["mesh"], shard["placements"], shard["coordinate"])


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-4", "CONF-1")
@settings(max_examples=10)
@given(
    st.sampled_from(MESHES),
    st.integers(5, 41),
    st.sampled_from([6, 10, 24]),
)
# a vocabulary of 37 rows (no mesh divides it) on each mesh
@example(MESHES[0], 37, 24)
@example(MESHES[1], 37, 24)
@example(MESHES[2], 37, 24)
def test_every_ranks_loaded_shard_is_its_placements_slice(
    impl: Impl, mesh: dict[str, int], vocab: int, intermediate: int
) -> None:
    model = llama(vocab, intermediate)
    ex = f"a Llama of vocabulary {vocab}, intermediate {intermediate}, loaded on {_mesh(mesh)}"
    with case():
        got = impl.hf_load(model, mesh, ex)
        check_shards(got, model["weights"], mesh["tp"] * mesh["fsdp"], ex)


def check_chunks(
    chunks: dict[str, list[tuple[Any, torch.Tensor]]],
    saved: dict[int, dict[str, dict[str, Any]]],
    weights: dict[str, torch.Tensor],
    ex: str,
) -> None:
    """A distributed checkpoint's pieces of each weight (CKPT-28, CKPT-1): each placed by its
    file, holding the reference's values at that place, and together the distinct non-empty
    boxes of the saving ranks' placements, each once."""
    for name, full in weights.items():
        boxes: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        for r, shards in sorted(saved.items()):
            shard = shards[name]
            idx = shard_indices(shard, full.shape)
            if any(not i for i in idx):
                continue
            if any(i != list(range(i[0], i[0] + len(i))) for i in idx):
                raise AssertionError(
                    f"rank {r} {name}: its piece under {shard['placements']} is no box, so no "
                    f"one chunk can hold it [{ex}]"
                )
            boxes.add((tuple(i[0] for i in idx), tuple(len(i) for i in idx)))
        got = chunks.get(name, [])
        found: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for offsets, t in got:
            if offsets is None or len(offsets) != full.dim():
                raise AssertionError(f"{name}: a piece with offsets {offsets} [{ex}]")
            box = (tuple(offsets), tuple(t.shape))
            if t.numel() == 0:
                continue
            region = tuple(slice(o, o + n) for o, n in zip(*box))
            assert_tensor_bitwise(
                f"{name} piece at {list(offsets)}", t, full[region], ex, "CKPT-28"
            )
            found.append(box)
        if sorted(found) != sorted(boxes):
            raise AssertionError(
                f"{name}: saved pieces {sorted(found)}, but the saving ranks' boxes are "
                f"{sorted(boxes)}, each once (CKPT-1) [{ex}]"
            )


@pytest.mark.rule("CKPT-20", "CKPT-28", "CKPT-1", "DTENSOR-4")
def test_every_save_loads_on_every_mesh_and_holds_the_saving_meshs_boxes(impl: Impl) -> None:
    """Saved on each mesh in both formats and loaded on each: every rank's shard is the
    reference's slice (9 pairs a format), and the distributed checkpoint's pieces are the
    saving ranks' boxes."""
    model = llama(37, 24)
    ex = "a Llama of vocabulary 37 saved on each of tp 4, fsdp 4, tp 2 x fsdp 2"
    with case():
        got = impl.hf_save_load_pairs(model, MESHES, ex)
        for i, save in enumerate(MESHES):
            check_shards(got["saved"][i], model["weights"], save["tp"] * save["fsdp"], ex)
            check_chunks(got["chunks"][i], got["saved"][i], model["weights"],
                         f"{ex}: the DCP save on {_mesh(save)}")  # fmt: skip
        for i, save in enumerate(MESHES):
            for fmt in ("dcp", "safetensors"):
                for j, load in enumerate(MESHES):
                    where = f"{ex}: saved ({fmt}) on {_mesh(save)}, loaded on {_mesh(load)}"
                    check_shards(got["loaded"][(i, fmt, j)], model["weights"],
                                 load["tp"] * load["fsdp"], where)  # fmt: skip


OURS = [
    (MESHES[2], "dcp", MESHES[0]),
    (MESHES[0], "safetensors", MESHES[1]),
]


@pytest.mark.rule("CKPT-28", "CKPT-22", "CKPT-23", "DTENSOR-4")
@pytest.mark.parametrize(
    ("save", "fmt", "load"),
    OURS,
    ids=[f"{fmt}-tp{s['tp']}fsdp{s['fsdp']}-to-tp{d['tp']}fsdp{d['fsdp']}" for s, fmt, d in OURS],
)
def test_shardspecs_load_of_a_save_fills_the_librarys_own_layouts(
    impl: Impl, save: dict[str, int], fmt: str, load: dict[str, int]
) -> None:
    """shardspec.checkpoint.load reads what the library saved (its DCP Hugging Face format,
    or its consolidated safetensors) into the tensor-parallel layouts the library gives its
    model on another mesh: every shard is what from_pretrained gives it, the reference's
    slice."""
    model = llama(37, 24)
    ex = (
        f"a Llama of vocabulary 37 loaded on {_mesh(save)}, saved ({fmt}), loaded by "
        f"shardspec.checkpoint.load into its layouts on {_mesh(load)}"
    )
    with case():
        got = impl.hf_save_shardspec_load(model, save, fmt, load, ex)
        check_shards(got, model["weights"], load["tp"] * load["fsdp"], ex)


OPTIMIZER = [(MESHES[2], MESHES[0]), (MESHES[0], MESHES[1]), (MESHES[1], MESHES[2])]


@pytest.mark.rule("CKPT-20", "DTENSOR-4")
@pytest.mark.parametrize(
    ("save", "load"),
    OPTIMIZER,
    ids=[f"tp{s['tp']}fsdp{s['fsdp']}-to-tp{d['tp']}fsdp{d['fsdp']}" for s, d in OPTIMIZER],
)
def test_adam_moments_saved_on_one_mesh_load_on_another(
    impl: Impl, save: dict[str, int], load: dict[str, int]
) -> None:
    """AdamW's moments, every element distinct, set on one mesh (each rank its placements'
    slice), saved by the library's distributed optimizer save and loaded by its distributed
    optimizer load on another: every rank's shard of every moment is the reference's slice,
    when saved and when loaded."""
    model = llama(37, 24)
    moments = {}
    for name, w in model["weights"].items():
        moments[f"{name}:exp_avg"] = w + 0.5
        moments[f"{name}:exp_avg_sq"] = w + 0.25
    ex = (
        f"AdamW moments of a Llama of vocabulary 37 saved on {_mesh(save)}, loaded on {_mesh(load)}"
    )
    with case():
        got = impl.hf_optimizer_round_trip(model, moments, save, load, ex)
        check_shards(got["saved"], moments, save["tp"] * save["fsdp"], f"{ex}: when saved")
        check_shards(got["loaded"], moments, load["tp"] * load["fsdp"], f"{ex}: when loaded")
