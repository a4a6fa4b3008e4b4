"""Benchmarks of the suite's own machinery (``python conformance/bench/pool.py``); a peer's
benchmark lives in its folder."""
