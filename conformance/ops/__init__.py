"""The operations the suite's ranks run, one module per area (``conformance.ops.<area>``).

Each area module registers its named operations in ``shardspec.testing.ops``'s table when a
pool imports it (:data:`conformance.OPS` lists them); none imports another, and what they
share lives in :mod:`conformance.ops.shared`. A peer's operations live in its own folder
(``conformance/peers/<name>/ops.py``) and are imported only while that peer is under test.
"""
