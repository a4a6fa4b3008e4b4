"""The conformance suite: a Hypothesis suite any implementation of the sharding spec runs."""

# The modules every pool of the suite imports on its ranks: each area registers its named
# operations itself; none imports another (what they share is conformance.ops_shared).
OPS = (
    "conformance.ops",
    "conformance.ops_dtensor",
    "conformance.ops_convert",
    "conformance.ops_reshard",
    "conformance.ops_fsdp",
    "conformance.ops_checkpoint",
)
