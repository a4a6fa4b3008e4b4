"""transformers 5.23.0's distributed loading and saving under the suite (``nox -s
peers_transformers``): the adapter (:mod:`.adapter`), its ranks' world functions
(:mod:`.worlds`) and its standalone repros (``repros/``)."""
