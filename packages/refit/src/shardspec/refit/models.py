"""Built-in recipes: Hugging Face checkpoints' names into vLLM's (REFIT-13).

Dense (Llama, Qwen2/3): ``q_proj``/``k_proj``/``v_proj`` -> packed ``qkv_proj`` (biases too,
for Qwen2), ``gate_proj``/``up_proj`` -> packed ``gate_up_proj``, ``embed_tokens`` and
``lm_head`` padded along the vocabulary (``lm_head`` from ``embed_tokens`` when tied), every
other tensor under its own name. MoE (Mixtral, Qwen-MoE): the same attention, and each layer's
experts stacked into ``w13_weight`` ``[E, 2I, H]`` (gate then up, packed) and ``w2_weight``
``[E, H, I]``. ``fp8=True`` wraps the linear weights (not embeddings, norms or the router) in
FP8 blocks.
"""

from __future__ import annotations

from .recipe import Expr, QuantizeFP8, Recipe, Source, Target, concat, pad, recipe, stack

__all__ = ["dense_to_vllm", "moe_to_vllm", "padded_vocab"]


def padded_vocab(vocab: int, multiple: int = 64) -> int:
    """``vocab`` rounded up to a multiple (vLLM pads to 64 times the TP degree, say)."""
    return -(-vocab // multiple) * multiple


def _linear(name: str, e: Expr, fp8: bool, block: tuple[int, int], ue8m0: bool) -> Target:
    return Target(name, QuantizeFP8(e, block, ue8m0) if fp8 else e)


def _attention(p: str, bias: bool, fp8: bool, block: tuple[int, int], ue8m0: bool) -> list[Target]:
    a = f"{p}.self_attn"
    out = [
        _linear(
            f"{a}.qkv_proj.weight",
            concat([f"{a}.{x}_proj.weight" for x in "qkv"], 0),
            fp8,
            block,
            ue8m0,
        ),
        _linear(f"{a}.o_proj.weight", Source(f"{a}.o_proj.weight"), fp8, block, ue8m0),
        Target(f"{p}.input_layernorm.weight", Source(f"{p}.input_layernorm.weight")),
        Target(
            f"{p}.post_attention_layernorm.weight",
            Source(f"{p}.post_attention_layernorm.weight"),
        ),
    ]
    if bias:
        out.append(Target(f"{a}.qkv_proj.bias", concat([f"{a}.{x}_proj.bias" for x in "qkv"], 0)))
    return out


def _ends(vocab: int, padded: int, tied: bool) -> list[Target]:
    embed = "model.embed_tokens.weight"
    head = embed if tied else "lm_head.weight"
    return [
        Target(embed, pad(embed, 0, max(padded, vocab))),
        Target("model.norm.weight", Source("model.norm.weight")),
        Target("lm_head.weight", pad(head, 0, max(padded, vocab))),
    ]


def dense_to_vllm(
    layers: int,
    vocab: int,
    padded: int | None = None,
    *,
    tied: bool = False,
    qkv_bias: bool = False,
    fp8: bool = False,
    block: tuple[int, int] = (128, 128),
    ue8m0: bool = False,
) -> Recipe:
    """A Llama/Qwen dense model of ``layers`` layers and a vocabulary of ``vocab``, padded to
    ``padded`` rows (default :func:`padded_vocab`)."""
    targets: list[Target] = []
    for i in range(layers):
        p = f"model.layers.{i}"
        targets += _attention(p, qkv_bias, fp8, block, ue8m0)
        m = f"{p}.mlp"
        targets.append(
            _linear(
                f"{m}.gate_up_proj.weight",
                concat([f"{m}.gate_proj.weight", f"{m}.up_proj.weight"], 0),
                fp8,
                block,
                ue8m0,
            )
        )
        targets.append(
            _linear(f"{m}.down_proj.weight", Source(f"{m}.down_proj.weight"), fp8, block, ue8m0)
        )
    targets += _ends(vocab, padded if padded is not None else padded_vocab(vocab), tied)
    return recipe(targets)


def moe_to_vllm(
    layers: int,
    vocab: int,
    experts: int,
    padded: int | None = None,
    *,
    style: str = "mixtral",
    tied: bool = False,
    fp8: bool = False,
    block: tuple[int, int] = (128, 128),
    ue8m0: bool = False,
) -> Recipe:
    """A Mixtral (``style="mixtral"``: ``block_sparse_moe.experts.E.w1/w3/w2``) or Qwen-MoE
    (``style="qwen_moe"``: ``mlp.experts.E.gate_proj/up_proj/down_proj``) model into vLLM's
    fused-MoE names: ``...experts.w13_weight`` and ``...experts.w2_weight``."""
    if style == "mixtral":
        moe, gate, up, down, router = "block_sparse_moe", "w1", "w3", "w2", "gate"
    elif style == "qwen_moe":
        moe, gate, up, down, router = "mlp", "gate_proj", "up_proj", "down_proj", "gate"
    else:
        raise ValueError(f"style must be 'mixtral' or 'qwen_moe', got {style!r}")
    targets: list[Target] = []
    for i in range(layers):
        p = f"model.layers.{i}"
        targets += _attention(p, False, fp8, block, ue8m0)
        e = f"{p}.{moe}.experts"
        w13 = stack(
            [concat([f"{e}.{x}.{gate}.weight", f"{e}.{x}.{up}.weight"], 0) for x in range(experts)]
        )
        w2 = stack([Source(f"{e}.{x}.{down}.weight") for x in range(experts)])
        targets.append(_linear(f"{e}.w13_weight", w13, fp8, block, ue8m0))
        targets.append(_linear(f"{e}.w2_weight", w2, fp8, block, ue8m0))
        targets.append(Target(f"{p}.{moe}.{router}.weight", Source(f"{p}.{moe}.{router}.weight")))
    targets += _ends(vocab, padded if padded is not None else padded_vocab(vocab), tied)
    return recipe(targets)
