"""DeepSpeed 0.19.8's ZeRO checkpoints under the suite (``nox -s peers_deepspeed``): the adapter
(:mod:`.adapter`), its ranks' save and load (:mod:`.worlds`) and its standalone repros
(``repros/``)."""
