"""An import-linter contract type for `nox -s lint` (`[tool.importlinter]` in pyproject.toml).

``no_circles``: no module imports, directly or through others, a module that imports it back.
import-linter's own ``acyclic_siblings`` compares the children of each package, so it cannot
see a circle between a package's ``__init__`` and one of its own modules (``impls/__init__.py``
importing ``impls/ours.py``, which imports ``from . import Impl``); this one checks every
module against grimp's graph, the graph import-linter builds. A module importing itself (a
``-m`` entry point reaching its imported copy) is not a circle.
"""

from __future__ import annotations

from typing import Any

from importlinter import Contract, ContractCheck, output


class NoCirclesContract(Contract):
    type_name = "no_circles"

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        # Modules that reach each other form one tangle; each is reported once, with the
        # shortest circle through it.
        shortest: dict[frozenset[str], tuple[str, ...]] = {}
        for importer in sorted(graph.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported == importer:
                    continue
                back = graph.find_shortest_chain(importer=imported, imported=importer)
                if back is None:
                    continue
                circle = (importer, *back)  # importer -> imported -> ... -> importer
                tangle = frozenset(
                    graph.find_upstream_modules(importer) & graph.find_downstream_modules(importer)
                    | {importer}
                )
                if tangle not in shortest or len(circle) < len(shortest[tangle]):
                    shortest[tangle] = circle
        tangles = sorted((sorted(t), c) for t, c in shortest.items())
        return ContractCheck(kept=not tangles, metadata={"tangles": tangles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for modules, circle in check.metadata["tangles"]:
            output.print_error(" -> ".join(circle), bold=False)
            if len(modules) > len(circle) - 1:
                tangled = ", ".join(modules)
                output.print_error(
                    f"  ({len(modules)} modules reach each other: {tangled})", bold=False
                )
            output.new_line()
