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
# Operation modules of a peer implementation under test (its own package, its own venv): the
# pools import them only when that implementation is selected, so the default suite never
# needs the peer's package.
PEER_OPS: dict[str, tuple[str, ...]] = {
    "bytecheckpoint": ("conformance.ops_bytecheckpoint",),
}


def ops_for(impl: str) -> tuple[str, ...]:
    """The operation modules the pools of a run against ``impl`` import."""
    return OPS + PEER_OPS.get(impl, ())
