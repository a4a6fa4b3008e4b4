"""The GPU half of the suite: ``python -m conformance.gpu`` (:mod:`.phases`), its benchmark
(``--bench``, :mod:`.bench`) and the environment both run in (:mod:`.env`)."""
