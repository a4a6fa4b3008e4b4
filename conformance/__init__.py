"""The conformance suite: a Hypothesis suite any implementation of the sharding spec runs."""

# The modules every pool of the suite imports on its ranks: each area registers its named
# operations itself; none imports another (what they share is conformance.ops.shared).
OPS = (
    "conformance.ops.pool",
    "conformance.ops.dtensor",
    "conformance.ops.convert",
    "conformance.ops.reshard",
    "conformance.ops.refit",
    "conformance.ops.fsdp",
    "conformance.ops.checkpoint",
)
