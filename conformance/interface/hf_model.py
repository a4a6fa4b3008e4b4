"""The hf_model area: a model library's own tensor-parallel and FSDP loading and saving of a
safetensors model (DTENSOR-*, CKPT-*: each rank's shard is its placements' slice of the file's
tensor): answered by transformers.

Its tests: ``conformance/tests/test_hf_model.py``. An adapter takes part by subclassing
:class:`HfModel` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`. A rank's answer is, per parameter name,
``{"mesh": mesh shape, "coordinate": the rank's coordinate, "placements": JSON placements
(conformance/codec.py), "local": its local tensor}``; a parameter that is no DTensor has mesh
``[]``, no placements and the whole tensor as its local one.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter


class HfModel(Adapter):
    """A model library's distributed loading and saving of safetensors models."""

    area = "hf_model"

    def hf_load(
        self, model: dict[str, Any], mesh: dict[str, int], example: str
    ) -> dict[int, dict[str, dict[str, Any]]]:
        """Write ``model`` (``"config"``: a Llama-style config's fields; ``"weights"``: every
        parameter's full tensor by name) as the library's model directory (its config file
        and one safetensors file), then load it on ``mesh["tp"] * mesh["fsdp"]`` ranks with
        the library's own distributed loading (tensor parallel over ``tp``, FSDP over
        ``fsdp``): each rank's parameters, as the module docstring says."""
        raise self.unsupported("distributed loading of a safetensors model")

    def hf_save_shardspec_load(
        self,
        model: dict[str, Any],
        save_mesh: dict[str, int],
        fmt: str,
        load_mesh: dict[str, int],
        example: str,
    ) -> dict[int, dict[str, dict[str, Any]]]:
        """As :meth:`hf_load` on ``save_mesh``, then saved by the library (``fmt``: ``"dcp"``,
        its distributed checkpoint; ``"safetensors"``, its consolidated files); what it saved
        is loaded by
        ``shardspec.checkpoint.load`` (CKPT-22, CKPT-28) into the parameters of the model the
        library loaded from ``model`` on ``load_mesh`` (its own layouts), every parameter
        zeroed first: each loading rank's parameters."""
        raise self.unsupported("saving a distributed model for shardspec's load")

    def hf_save_load_pairs(
        self, model: dict[str, Any], meshes: list[dict[str, int]], example: str
    ) -> dict[str, Any]:
        """As :meth:`hf_load` on each of ``meshes``, saved there in both formats, and each of
        those saves loaded on each of ``meshes``: ``{"saved": {i: each rank's parameters on
        meshes[i] when it saved}, "loaded": {(i, fmt, j): each rank's parameters on
        meshes[j], loaded from the ``fmt`` save ("dcp" or "safetensors") made on
        meshes[i]}, "chunks": {i: {name: [(offsets, tensor), ...]}}}``, where ``chunks`` are
        the pieces of each parameter the ``"dcp"`` save on meshes[i] holds, each at the
        offsets its file records."""
        raise self.unsupported("saving and loading a distributed model")

    def hf_optimizer_round_trip(
        self,
        model: dict[str, Any],
        moments: dict[str, Any],
        save_mesh: dict[str, int],
        load_mesh: dict[str, int],
        example: str,
    ) -> dict[str, Any]:
        """As :meth:`hf_load` on ``save_mesh``, with an AdamW optimizer whose moments are set
        to ``moments`` (full tensors by ``"<parameter>:exp_avg"`` and
        ``"<parameter>:exp_avg_sq"``), saved by the library's distributed optimizer save and
        loaded by its distributed optimizer load into a fresh AdamW of the model loaded on
        ``load_mesh``: ``{"saved": each saving rank's moments, "loaded": each loading rank's
        moments}``, each rank's as a rank's parameters are given, keyed as ``moments``."""
        raise self.unsupported("a distributed optimizer save and load")
