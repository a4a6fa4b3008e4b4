"""The conformance suite: a Hypothesis suite any implementation of the sharding spec runs."""

# The modules every pool of the suite imports on its ranks (they register the named operations).
OPS = ("conformance.ops",)
