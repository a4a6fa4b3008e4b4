"""The zero_checkpoint area: a ZeRO trainer's checkpoints, converted and loaded on another
data-parallel world (FLAT-6..8: spec/11-flat.md): answered by DeepSpeed.

Its tests: ``conformance/tests/test_zero_checkpoint.py``. An adapter takes part by subclassing
:class:`ZeroCheckpoint` (with its other areas); a method it does not override answers
:class:`~conformance.interface.Unsupported`.
"""

from __future__ import annotations

from typing import Any

from conformance.interface.base import Adapter


class ZeroCheckpoint(Adapter):
    """ZeRO checkpoints saved, made universal and loaded on another world (FLAT-6..8)."""

    area = "zero_checkpoint"

    def zero_round_trip(
        self, save: dict[str, Any], load: dict[str, Any], example: str
    ) -> dict[str, Any]:
        """A model of one parameter per shape in ``save["shapes"]`` (dtype ``save["dtype"]``,
        one parameter group, ``torch.optim.Adam``) under ZeRO stage ``save["stage"]`` on
        ``save["dp"]`` ranks, after one step, its fp32 values and Adam moments set to
        ``conformance.reference.zero_truth(shapes)`` and saved; the checkpoint made whole
        again (the implementation's offline conversion) and loaded into a fresh model on
        ``load["dp"]`` ranks at stage ``load["stage"]``; and read back offline to fp32.

        Returns ``{"save": ..., "load": ..., "fp32": ...}``: for ``save`` and ``load``, per
        rank, ``{"partition": {key: flat tensor}, "read": {name: {key: flat tensor}}}`` (the
        rank's flat partition of the group, keys ``fp32``, ``exp_avg``, ``exp_avg_sq``; and
        each parameter ``p<i>``'s full values as the implementation reads them back, plus
        ``param``, the module's own parameter); ``fp32``: the offline fp32 state dict,
        ``{name: flat tensor}``."""
        raise self.unsupported("ZeRO checkpoints")

    def zero_set_full(self, save: dict[str, Any], example: str) -> dict[int, dict[str, Any]]:
        """A model as :meth:`zero_round_trip` makes it (``save``), after one step, each
        parameter's full fp32 value and Adam moments set to ``zero_truth``'s through the
        implementation's own setters of full values: per rank ``{"partition": {key: flat
        tensor}}``, as there."""
        raise self.unsupported("setting full values of ZeRO-partitioned parameters")
