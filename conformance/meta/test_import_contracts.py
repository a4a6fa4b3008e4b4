"""The import contracts `nox -s lint` checks (pyproject.toml, ``[tool.importlinter]``), read as
import-linter reads them and held to small made-up import graphs: a tree whose arrows point one
way keeps them all, and each kind of wrong arrow breaks exactly the contracts meant for it.
Known exceptions (``ignore_imports``, none today) would be left out here."""

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
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.contracts.protected import ProtectedContract

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN: dict[str, type[Any]] = {
    "layers": LayersContract,
    "protected": ProtectedContract,
    "acyclic_siblings": AcyclicSiblingsContract,
    "forbidden": ForbiddenContract,
    "independence": IndependenceContract,
}

# A tree that keeps the arrows: importer -> imported.
TREE = [
    ("shardspec.metadata", "shardspec.metadata.layout"),
    ("shardspec.metadata.layout", "shardspec.metadata.validate"),
    ("shardspec.reshard.planner", "shardspec.metadata"),
    ("shardspec.testing.pool", "shardspec.metadata.layout"),
    ("shardspec.fsdp.rules", "shardspec.reshard.planner"),
    ("shardspec.torchrec.plans", "shardspec.reshard.planner"),
    ("conformance.ops.pool", "shardspec.testing.pool"),
    ("conformance.ops.pool", "shardspec.fsdp.rules"),
    ("conformance.ops.pool", "shardspec.torchrec.plans"),
    ("conformance.impls", "conformance.impls.ours"),
    ("conformance.impls.ours", "shardspec.metadata"),
    ("shardspec.checkpoint.cli", "shardspec.reshard.planner"),
    ("conformance.ops.pool", "shardspec.checkpoint.cli"),
    ("shardspec.refit.planner", "shardspec.reshard.planner"),
    ("conformance.ops.pool", "shardspec.refit.planner"),
    # the suite's rooms
    ("conformance.report.write", "conformance.impls"),
    ("conformance.impls.ours", "conformance.interface.chunk"),
    ("conformance.interface.chunk", "conformance.interface.base"),
    ("conformance.interface.base", "conformance.codec"),
    ("conformance.interface.collective_load", "conformance.faults.damage"),
    ("conformance.cases", "conformance.interface.base"),
    ("conformance.ops.pool", "conformance.reference"),
    ("conformance.strategies.grids", "conformance.codec"),
    ("conformance.peers.megatron.adapter", "conformance.interface.chunk"),
    ("conformance.peers.bytecheckpoint.adapter", "conformance.interface.base"),
    ("conformance.peers.bytecheckpoint.ops", "conformance.ops.shared"),
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


# The suite's rooms no arrow of the tree touches: a layers contract needs each layer to exist.
ROOMS = ["conformance.models", "conformance.gpu", "conformance.bench", "conformance.assertions"]


def _graph(imports: list[tuple[str, str]]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for room in ROOMS:
        graph.add_module("conformance")
        graph.add_module(room)
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
        "forbidden",
        "independence",
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
            ("shardspec.reshard.planner", "conformance.ops.pool"),
            {"layers", "no_circles", "forbidden"},
            id="a-package-imports-the-suite",
        ),
        pytest.param(
            ("conformance.peers.megatron.adapter", "conformance.peers.bytecheckpoint.ops"),
            {"independence"},
            id="a-peer-imports-another",
        ),
        pytest.param(
            ("conformance.impls.ours", "conformance.peers.megatron.adapter"),
            {"layers"},
            id="a-built-in-adapter-imports-a-peer",
        ),
        pytest.param(
            ("conformance.ops.pool", "conformance.peers.bytecheckpoint.ops"),
            {"layers", "acyclic_siblings"},  # the peer's operations build on ops.shared
            id="the-suites-operations-import-a-peer",
        ),
        pytest.param(
            ("conformance.interface.base", "conformance.impls"),
            {"layers", "acyclic_siblings", "no_circles"},
            id="the-interface-imports-the-adapters",
        ),
        pytest.param(
            ("conformance.ops.pool", "conformance.strategies.grids"),
            {"layers"},
            id="the-ranks-operations-import-the-strategies",
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
            ("shardspec.refit.planner", "shardspec.checkpoint.cli"),
            {"layers"},
            id="refit-and-checkpoint-are-independent",
        ),
        pytest.param(
            ("shardspec.reshard.planner", "shardspec.refit.planner"),
            {"layers", "acyclic_siblings", "no_circles"},
            id="reshard-imports-refit",
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
