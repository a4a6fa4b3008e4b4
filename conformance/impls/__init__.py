"""The built-in adapters, and how the suite picks the implementation under test.

An adapter is a subclass of :class:`~conformance.interface.Adapter` and of the areas it takes
part in (:mod:`conformance.interface`; :class:`Impl` takes every area), named
``package.module:Adapter`` (spec CONF-15):
``SHARDSPEC_IMPL=mymod:MyImpl`` or ``pytest --impl mymod:MyImpl`` runs the suite against it,
from any module importable by the driver and by the pool's ranks (they inherit the driver's
``sys.path``). The built-in adapters are names in :data:`BUILTINS` for the same form:
``shardspec`` (ours), ``torch`` (upstream), ``broken`` (test-only: ours with chunk offsets
off by one on uneven dims and a packed part shifted by a row in refit, which the suite must
catch), ``naive-refit`` (the refit area only: the full-tensor baseline), and the peers, each
run in its own venv with its real package (``bytecheckpoint``: ``nox -s peers_bytecheckpoint``;
``megatron``: ``nox -s peers_megatron``), each in its own folder, ``conformance/peers/<name>/``.
``get_impl(name)`` returns one.

Every adapter method answers one question the spec settles. A method an implementation cannot
answer raises :class:`Unsupported` with the reason, and a method of an area the adapter does
not take part in answers the same; the suite reports that case as "unsupported by <impl>:
<reason>" instead of passing or skipping it silently. Besides its answers an adapter states
its ``name``, its ``version()``, the modules its ranks import to register its named operations
(``rank_ops``) and its known defects (``known_defects``).

The built-in adapters (:mod:`.ours`, :mod:`.upstream`, :mod:`.broken`) import the interface
and :mod:`.dcp_memory`, never this package, which only picks one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from conformance.interface import AREAS, Adapter, Impl, KnownDefect, Unsupported

__all__ = [
    "AREAS",
    "BUILTINS",
    "IMPLS",
    "Adapter",
    "Impl",
    "ImplError",
    "KnownDefect",
    "Unsupported",
    "get_impl",
    "impl_name",
    "pool_ops",
]


class ImplError(ValueError):
    """``SHARDSPEC_IMPL`` / ``--impl`` names no usable adapter; the message says what is wrong."""


# The built-in adapters, by name: the same "module:Class" form any adapter has.
BUILTINS: dict[str, str] = {
    "shardspec": "conformance.impls.ours:ShardspecImpl",
    "torch": "conformance.impls.upstream:TorchImpl",
    "broken": "conformance.impls.broken:BrokenImpl",
    # the naive refit baseline (full tensors everywhere), in the refit area only
    "naive-refit": "conformance.impls.naive_refit:NaiveRefitImpl",
    # The peers, each run in its own virtualenv with its real package (DESIGN.md section 4):
    "megatron": "conformance.peers.megatron.adapter:MegatronImpl",
    "bytecheckpoint": "conformance.peers.bytecheckpoint.adapter:ByteCheckpointImpl",
    "deepspeed": "conformance.peers.deepspeed.adapter:DeepSpeedImpl",
    "transformers": "conformance.peers.transformers.adapter:TransformersImpl",
}
IMPLS = tuple(BUILTINS)
_CACHE: dict[str, Adapter] = {}


def impl_name() -> str:
    """What ``SHARDSPEC_IMPL`` names: a built-in name or ``package.module:Adapter``."""
    return os.environ.get("SHARDSPEC_IMPL", "shardspec")


def _refuse(spec: str, what: str) -> ImplError:
    return ImplError(
        f"implementation {spec!r}: {what}. Name a built-in implementation "
        f"({', '.join(IMPLS)}) or an adapter as 'package.module:Adapter', a subclass of "
        "conformance.interface.Adapter (and of the areas it takes part in) in a module "
        "importable here and on the pool's ranks "
        "(conformance/README.md, 'Writing an adapter')"
    )


def _load(spec: str) -> Adapter:
    target = BUILTINS.get(spec, spec)
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr or ":" in attr:
        raise _refuse(spec, "not a built-in name, nor of the form 'package.module:Adapter'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        missing = isinstance(e, ModuleNotFoundError) and e.name == module_name
        what = "is not found (is its folder on PYTHONPATH?)" if missing else "failed to import"
        raise _refuse(spec, f"module {module_name!r} {what}: {type(e).__name__}: {e}") from e
    cls = getattr(module, attr, None)
    if cls is None:
        raise _refuse(spec, f"module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise _refuse(spec, f"{target} is {cls!r}, not a subclass of conformance.interface.Adapter")
    impl = cls()
    if impl.name == Adapter.name:
        impl.name = target
    for key, defect in impl.known_defects.items():
        if not isinstance(key, str) or not isinstance(defect, KnownDefect):
            raise _refuse(
                spec, f"known_defects[{key!r}] is {defect!r}, not a conformance.impls.KnownDefect"
            )
    for ops_module in impl.rank_ops:
        try:
            found = importlib.util.find_spec(ops_module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise _refuse(spec, f"rank_ops names {ops_module!r}, which is not importable")
    return impl


def get_impl(name: str | None = None) -> Adapter:
    """The adapter ``name`` (default: ``SHARDSPEC_IMPL``), loaded once; :class:`ImplError`
    says what is wrong with a name that gives none."""
    name = name or impl_name()
    if name not in _CACHE:
        _CACHE[name] = _load(name)
    return _CACHE[name]


def pool_ops(impl: Adapter | None = None) -> tuple[str, ...]:
    """The modules every rank of the suite's pools imports: :data:`conformance.OPS` and the
    adapter's own ``rank_ops``."""
    from conformance import OPS

    extra = (impl or get_impl()).rank_ops
    return (*OPS, *(m for m in extra if m not in OPS))
