"""The import contracts `nox -s lint` checks (pyproject.toml, ``[tool.importlinter]``), read as
import-linter reads them and held to small made-up import graphs: a tree whose arrows point one
way keeps them all, and each kind of wrong arrow breaks exactly the contracts meant for it.
The known exceptions the configuration lists (``ignore_imports``) are left out here."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import configuration
from importlinter.application.use_cases import read_user_options
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.layers import LayersContract
from importlinter.contracts.protected import ProtectedContract

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN: dict[str, type[Any]] = {
    "layers": LayersContract,
    "protected": ProtectedContract,
    "acyclic_siblings": AcyclicSiblingsContract,
}

# A tree that keeps the arrows: importer -> imported.
TREE = [
    ("shardspec.metadata", "shardspec.metadata.layout"),
    ("shardspec.metadata.layout", "shardspec.metadata.validate"),
    ("shardspec.reshard.planner", "shardspec.metadata"),
    ("shardspec.testing.pool", "shardspec.metadata.layout"),
    ("shardspec.fsdp.rules", "shardspec.reshard.planner"),
    ("shardspec.torchrec.plans", "shardspec.reshard.planner"),
    ("conformance.ops", "shardspec.testing.pool"),
    ("conformance.ops", "shardspec.fsdp.rules"),
    ("conformance.ops", "shardspec.torchrec.plans"),
    ("conformance.impls", "conformance.impls.ours"),
    ("conformance.impls.ours", "shardspec.metadata"),
    ("shardspec.checkpoint.cli", "shardspec.reshard.planner"),
    ("conformance.ops", "shardspec.checkpoint.cli"),
]


def _contracts() -> list[Any]:
    configuration.configure()  # what lint-imports does first: its file readers and timer
    options = read_user_options(str(ROOT / "pyproject.toml"))
    types = dict(BUILT_IN)
    for entry in options.session_options.get("contract_types", []):
        name, _, target = (part.strip() for part in entry.partition(":"))
        module_name, _, class_name = target.rpartition(".")
        spec = importlib.util.spec_from_file_location(
            module_name, ROOT / ".ci" / f"{module_name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        types[name] = getattr(module, class_name)
    contracts = []
    for raw in options.contracts_options:
        kept = {k: v for k, v in raw.items() if k != "ignore_imports"}
        contracts.append(
            types[raw["type"]](
                name=raw["name"], session_options=options.session_options, contract_options=kept
            )
        )
    return contracts


def _graph(imports: list[tuple[str, str]]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        for module in (importer, imported):
            parts = module.split(".")
            for i in range(1, len(parts) + 1):
                graph.add_module(".".join(parts[:i]))
        graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="")
    return graph


def _broken(imports: list[tuple[str, str]]) -> set[str]:
    """The types of the configured contracts that ``imports`` break."""
    graph = _graph(imports)
    return {
        c.type_name for c in _contracts() if not c.check(copy.deepcopy(graph), verbose=False).kept
    }


def test_every_contract_is_checked_here() -> None:
    assert {c.type_name for c in _contracts()} == {
        "layers",
        "protected",
        "acyclic_siblings",
        "no_circles",
    }


def test_a_tree_whose_arrows_point_one_way_keeps_every_contract() -> None:
    assert _broken(TREE) == set()


@pytest.mark.parametrize(
    ("arrow", "broken"),
    [
        pytest.param(
            ("shardspec.metadata.validate", "shardspec.reshard.planner"),
            {"layers", "acyclic_siblings", "no_circles"},
            id="metadata-imports-reshard",
        ),
        pytest.param(
            ("shardspec.testing.pool", "shardspec.reshard.planner"),
            {"layers"},
            id="testing-imports-more-than-metadata",
        ),
        pytest.param(
            ("shardspec.reshard.planner", "conformance.ops"),
            {"layers", "no_circles"},
            id="a-package-imports-the-suite",
        ),
        pytest.param(
            ("shardspec.fsdp.rules", "shardspec.torchrec.plans"),
            {"layers"},
            id="fsdp-and-torchrec-are-independent",
        ),
        pytest.param(
            ("shardspec.fsdp.rules", "shardspec.checkpoint.cli"),
            {"layers"},
            id="fsdp-and-checkpoint-are-independent",
        ),
        pytest.param(
            ("shardspec.fsdp.rules", "shardspec.testing.pool"),
            {"protected"},
            id="a-package-imports-testing",
        ),
        pytest.param(
            ("shardspec.metadata.validate", "shardspec.metadata.layout"),
            {"acyclic_siblings", "no_circles"},
            id="two-modules-import-each-other",
        ),
        pytest.param(
            ("conformance.impls.ours", "conformance.impls"),
            {"no_circles"},
            id="a-module-imports-its-package-init-back",
        ),
    ],
)
def test_each_wrong_arrow_breaks_the_contracts_meant_for_it(
    arrow: tuple[str, str], broken: set[str]
) -> None:
    assert _broken([*TREE, arrow]) == broken
