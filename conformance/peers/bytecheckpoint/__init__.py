"""ByteCheckpoint 0.0.2 under the suite (``nox -s peers_bytecheckpoint``): the adapter
(:mod:`.adapter`), its ranks' operations (:mod:`.ops`), the loopback shim its saves run under
(:mod:`.env`), the generator of its committed test checkpoint (:mod:`.data`), its load
benchmark (:mod:`.bench`) and its standalone repros (``repros/``)."""
