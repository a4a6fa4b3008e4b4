"""The suite's reports: running the suite, the standalone repros and the performance probes
(:mod:`.write`, ``python -m conformance.report``), folding failures into one entry per
defect (:mod:`.entries`), drawing layouts (:mod:`.draw`), running one repro on loopback
(:mod:`.repro_run`), the probes (:mod:`.probes`) and the verdicts over several torch releases
(:mod:`.matrix`, ``python -m conformance.report.matrix``)."""
