"""The peers the suite judges, one folder each (``conformance/peers/<name>/``): its adapter,
the operations its ranks run, its test data and environment, its benchmark and its
standalone repros. Each runs in its own virtualenv with its real package (``nox -s
peers_<name>``); no peer imports another, and deleting a peer is deleting its folder and its
line in :data:`conformance.impls.BUILTINS`."""
