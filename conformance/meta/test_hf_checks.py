"""The hf_model area's checks catch a wrong shard (CONF-5), without transformers: a model
library made from the reference (each weight's rows or columns chunked over the mesh as a
tensor-parallel plan does, locals sliced by the reference's DTensor indices) passes, and each
seeded defect fails with the rank and the weight named: a shard read one row late (an
off-by-one in slicing straight from safetensors), and the last rows of an uneven vocabulary
held by no rank (the lost data reported under column-wise plans). Its distributed checkpoint's
pieces too: the reference's (each rank's box once) pass, and a piece placed one row off, a
replica saved twice and a lost piece are each caught with the weight named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from conformance import reference
from conformance.cases import case
from conformance.interface import HfModel
from conformance.tests.test_hf_model import (
    MESHES,
    check_chunks,
    check_shards,
    llama,
    shard_indices,
)


class ReferenceLibrary(HfModel):
    """Rows of every 2-d weight sharded over tp (then fsdp), vectors replicated."""

    name = "reference-hf"

    def __init__(self, seed: Callable[[dict[int, Any]], None] | None = None) -> None:
        self.seed = seed

    def hf_load(
        self, model: dict[str, Any], mesh: dict[str, int], example: str
    ) -> dict[int, dict[str, dict[str, Any]]]:
        shape = [mesh["fsdp"], mesh["tp"]]
        out: dict[int, dict[str, dict[str, Any]]] = {}
        for r in range(mesh["fsdp"] * mesh["tp"]):
            coord = [r // mesh["tp"], r % mesh["tp"]]
            out[r] = {}
            for name, full in model["weights"].items():
                if full.dim() == 1:
                    out[r][name] = {"mesh": [], "coordinate": [], "placements": [], "local": full}
                    continue
                placements = [["S", 0], ["S", 0]]
                idx = reference.dtensor_indices(full.shape, shape, placements, coord)
                out[r][name] = {
                    "mesh": shape,
                    "coordinate": coord,
                    "placements": placements,
                    "local": reference.gather(full, idx),
                }
        if self.seed is not None:
            self.seed(out)
        return out


def _one_row_late(got: dict[int, Any]) -> None:
    """Rank 1's lm_head shard read one row late (its last row the next rank's first)."""
    shard = got[1]["lm_head.weight"]
    rows = shard["local"].shape[0]
    shard["local"] = torch.cat([shard["local"][1:], shard["local"][-1:] + 1000.0])[:rows]


def _lost_tail(got: dict[int, Any]) -> None:
    """The last rank's embedding shard claims a mesh coordinate another rank has: the rows
    that rank should hold are held by none."""
    other = got[0]["model.embed_tokens.weight"]
    got[max(got)]["model.embed_tokens.weight"] = {**other, "local": other["local"].clone()}


@pytest.mark.rule("CONF-5")
@pytest.mark.parametrize("mesh", MESHES, ids=["tp4", "fsdp4", "tp2fsdp2"])
def test_the_reference_library_passes(mesh: dict[str, int]) -> None:
    model = llama(37, 24)
    with case():
        got = ReferenceLibrary().hf_load(model, mesh, "meta")
        check_shards(got, model["weights"], mesh["tp"] * mesh["fsdp"], "meta")


@pytest.mark.rule("CONF-5")
@pytest.mark.parametrize("mesh", MESHES, ids=["tp4", "fsdp4", "tp2fsdp2"])
@pytest.mark.parametrize(
    ("seed", "message"),
    [
        (_one_row_late, r"rank 1 lm_head\.weight .*\.flat\[\d+\]="),
        (_lost_tail, r"model\.embed_tokens\.weight: \d+ of 592 elements held by no rank"),
    ],
    ids=["one-row-late", "lost-rows"],
)
def test_each_seeded_defect_is_caught(
    mesh: dict[str, int], seed: Callable[[dict[int, Any]], None], message: str
) -> None:
    model = llama(37, 24)
    got = ReferenceLibrary(seed).hf_load(model, mesh, "meta")
    with pytest.raises(AssertionError, match=message), case():
        check_shards(got, model["weights"], mesh["tp"] * mesh["fsdp"], "meta")


def reference_chunks(
    saved: dict[int, dict[str, dict[str, Any]]], weights: dict[str, torch.Tensor]
) -> dict[str, list[tuple[Any, torch.Tensor]]]:
    """What a distributed checkpoint of ``saved`` holds: each distinct non-empty box once."""
    out: dict[str, list[tuple[Any, torch.Tensor]]] = {}
    for name, full in weights.items():
        seen = set()
        for r in sorted(saved):
            idx = shard_indices(saved[r][name], full.shape)
            if any(not i for i in idx):
                continue
            offsets = tuple(i[0] for i in idx)
            if offsets in seen:
                continue
            seen.add(offsets)
            out.setdefault(name, []).append((list(offsets), reference.gather(full, idx)))
    return out


def _piece_one_row_off(chunks: dict[str, Any]) -> None:
    """lm_head's second piece recorded one row later than it lies."""
    offsets, t = chunks["lm_head.weight"][1]
    chunks["lm_head.weight"][1] = ([offsets[0] + 1, *offsets[1:]], t)


def _replica_twice(chunks: dict[str, Any]) -> None:
    """A replicated norm weight saved by two ranks."""
    chunks["model.norm.weight"].append(chunks["model.norm.weight"][0])


def _lost_piece(chunks: dict[str, Any]) -> None:
    """The embedding's last piece missing (its file lost)."""
    chunks["model.embed_tokens.weight"].pop()


@pytest.mark.rule("CONF-5")
@pytest.mark.parametrize("mesh", MESHES, ids=["tp4", "fsdp4", "tp2fsdp2"])
def test_the_reference_checkpoints_pieces_pass(mesh: dict[str, int]) -> None:
    model = llama(37, 24)
    saved = ReferenceLibrary().hf_load(model, mesh, "meta")
    with case():
        check_chunks(reference_chunks(saved, model["weights"]), saved, model["weights"], "meta")


@pytest.mark.rule("CONF-5")
@pytest.mark.parametrize(
    ("seed", "message"),
    [
        (_piece_one_row_off, r"lm_head\.weight piece at \[\d+, 0\]"),
        (_replica_twice, r"model\.norm\.weight: saved pieces .* each once"),
        (_lost_piece, r"model\.embed_tokens\.weight: saved pieces .* each once"),
    ],
    ids=["one-row-off", "replica-twice", "lost-piece"],
)
def test_each_seeded_checkpoint_defect_is_caught(
    seed: Callable[[dict[str, Any]], None], message: str
) -> None:
    model = llama(37, 24)
    saved = ReferenceLibrary().hf_load(model, MESHES[0], "meta")
    chunks = reference_chunks(saved, model["weights"])
    seed(chunks)
    with pytest.raises(AssertionError, match=message), case():
        check_chunks(chunks, saved, model["weights"], "meta")
