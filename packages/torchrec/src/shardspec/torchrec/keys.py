"""One table, three names: the module path with the table (``"ebc.t0"``), the bare table name
(``"t0"``) and the state-dict key (``"ebc.embedding_bags.t0.weight"``) (TORCHREC-19).

A plan names tables by module path and table name, a state dict by key; every function of
this package that takes table names accepts any of the three and resolves it against the names
it has. No torch, no TorchRec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from shardspec.metadata import ConversionError

__all__ = [
    "FORMS",
    "TableName",
    "parse_table_name",
    "resolve_table",
    "resolve_tables",
    "same_table",
]

# EmbeddingBagCollection keeps its tables under ``embedding_bags``, EmbeddingCollection under
# ``embeddings``; both the plain and the sharded modules' state dicts say ``<table>.weight``.
_STATE_KEY = re.compile(
    r"^(?:(?P<module>.+)\.)?(?:embedding_bags|embeddings)\.(?P<table>[^.]+)\.weight$"
)

FORMS = (
    "the module path with the table ('ebc.t0'), the table name ('t0') or the state-dict key "
    "('ebc.embedding_bags.t0.weight')"
)


class TableName(NamedTuple):
    """A table's module path ("" when the name does not say) and its name."""

    module: str
    table: str

    def same_table(self, other: TableName) -> bool:
        """The names can mean the same table: equal names, and equal module paths unless one
        of them does not say."""
        return self.table == other.table and (
            self.module == other.module or not self.module or not other.module
        )


def parse_table_name(name: str) -> TableName:
    """The module path and table of any of the three forms."""
    m = _STATE_KEY.match(name)
    if m is not None:
        return TableName(m["module"] or "", m["table"])
    module, _, table = name.rpartition(".")
    return TableName(module, table)


def same_table(a: str, b: str) -> bool:
    """Whether two names, in any of the three forms, can mean the same table."""
    return a == b or parse_table_name(a).same_table(parse_table_name(b))


def resolve_table(name: str, names: Iterable[str], *, what: str = "names") -> str:
    """The one name among ``names`` for the table ``name`` means (any of the three forms on
    either side); an exact match wins. None or several raise :class:`ConversionError`."""
    pool = list(names)
    if name in pool:
        return name
    want = parse_table_name(name)
    hits = [n for n in pool if want.same_table(parse_table_name(n))]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ConversionError(
            f"no table {name!r} among the {what} {sorted(pool)}; a table may be named by {FORMS}"
        )
    raise ConversionError(
        f"{name!r} names several tables among the {what}: {sorted(hits)}; name it with its "
        f"module path"
    )


def resolve_tables(
    names: Iterable[str], pool: Iterable[str], *, what: str = "names"
) -> dict[str, str]:
    """``{given name: name in pool}`` for every name; two names of the same table raise."""
    pool = list(pool)
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name in names:
        hit = resolve_table(name, pool, what=what)
        if hit in seen and seen[hit] != name:
            raise ConversionError(f"{seen[hit]!r} and {name!r} name the same table {hit!r}")
        seen[hit] = name
        out[name] = hit
    return out
