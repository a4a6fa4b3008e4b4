"""shardspec.refit: a training job's weights into a serving job's layout (spec/10-refit.md).

* :mod:`shardspec.refit.recipe` — the recipe as data: per destination tensor an expression of
  renames, (packed) concatenation, padding, stacking, transposes, casts and FP8 blocks.
* :mod:`shardspec.refit.models` — built-in recipes (HF Llama/Qwen dense and Mixtral/Qwen-MoE
  into vLLM names and layouts).
* :func:`plan_refit` — one rank's plan; :func:`refit` — the executor, through the reshard
  executor over one group spanning both sides.
* :mod:`shardspec.refit.reference` — the single-process oracle.

Importing this package does not import torch; the executor and the quantizer import it when
called.
"""

from __future__ import annotations

from .errors import RefitError
from .executor import refit
from .layouts import packed_layout, scale_layout, split_local
from .planner import RefitPlan, plan_refit
from .recipe import (
    Cast,
    Concat,
    Pad,
    QuantizeFP8,
    Recipe,
    Select,
    Source,
    Stack,
    Target,
    Transpose,
    concat,
    pad,
    quantize_fp8,
    recipe,
    rename,
    stack,
    unstack,
)
from .serialize import recipe_from_data, recipe_to_data

__all__ = [
    "Cast",
    "Concat",
    "Pad",
    "QuantizeFP8",
    "Recipe",
    "RefitError",
    "RefitPlan",
    "Select",
    "Source",
    "Stack",
    "Target",
    "Transpose",
    "concat",
    "packed_layout",
    "pad",
    "plan_refit",
    "quantize_fp8",
    "recipe",
    "recipe_from_data",
    "recipe_to_data",
    "refit",
    "rename",
    "scale_layout",
    "split_local",
    "stack",
    "unstack",
]
