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
# A peer's own operations, imported by the pools only while that peer is under test: they
# import the peer's package, which the default environment does not have.
PEER_OPS = {"megatron": ("conformance.ops_megatron",)}


def ops_for(impl: str | None = None) -> tuple[str, ...]:
    """The modules a pool imports while ``impl`` (default: the one under test) runs."""
    from conformance.impls import impl_name

    return OPS + PEER_OPS.get(impl or impl_name(), ())
