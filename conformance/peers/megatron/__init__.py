"""Megatron-Core 0.19.2's ``dist_checkpointing`` under the suite (``nox -s peers_megatron``):
the adapter (:mod:`.adapter`), its ranks' save and load operations (:mod:`.ops`) and its
standalone repros (``repros/``)."""
