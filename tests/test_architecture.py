"""The import contracts of ``service`` (pyproject.toml, ``[tool.importlinter]``) and no import
circles: checked here because CI runs only pytest."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import configuration
from importlinter.application.use_cases import lint_imports, read_user_options
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.protected import ProtectedContract

from bench.import_graph import build_graph, local_imports, measure, strongly_connected

configuration.configure()  # what the lint-imports command does before it reads a configuration

PYPROJECT = str(Path(__file__).resolve().parent.parent / "pyproject.toml")
_CONTRACT_TYPES: dict[str, Any] = {"forbidden": ForbiddenContract, "protected": ProtectedContract}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """Imports that run (those under ``if TYPE_CHECKING:`` left out, as the contracts do)."""
    return build_graph(type_checking=False)


def broken_contracts(graph: grimp.ImportGraph) -> list[str]:
    """The ids of the configured contracts that ``graph`` breaks."""
    options = read_user_options(PYPROJECT)
    broken = []
    for contract_options in options.contracts_options:
        contract = _CONTRACT_TYPES[contract_options["type"]](
            name=contract_options["name"],
            session_options=options.session_options,
            contract_options=contract_options,
        )
        if not contract.check(copy.deepcopy(graph), verbose=False).kept:
            broken.append(contract_options["id"])
    return broken


def test_the_import_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    # As `lint-imports` runs them; its report (which contract, which import) is in the output.
    kept = lint_imports(config_filename=PYPROJECT, cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert kept, report
    assert "0 broken" in report


def test_every_contract_type_in_the_configuration_is_checked_here() -> None:
    types = {c["type"] for c in read_user_options(PYPROJECT).contracts_options}
    assert types <= _CONTRACT_TYPES.keys()


def test_the_contracts_catch_an_import_up_the_layers(graph: grimp.ImportGraph) -> None:
    assert broken_contracts(graph) == []
    upward = copy.deepcopy(graph)
    upward.add_import(importer="service.db.engine", imported="service.http")
    assert "foundations-stay-below" in broken_contracts(upward)
    wired = copy.deepcopy(graph)
    wired.add_import(importer="service.queue.worker", imported="service.memories.service")
    assert "queue-knows-no-domain" in broken_contracts(wired)
    runtime = copy.deepcopy(graph)
    runtime.add_import(importer="service.memories.routes", imported="service.runtime")
    assert "wiring-on-top" in broken_contracts(runtime)


def test_the_contracts_catch_a_read_of_another_aggregates_repository(
    graph: grimp.ImportGraph,
) -> None:
    for importer, repository, contract in [
        ("service.recall.tools", "service.memories.repository", "memories-repository"),
        ("service.todos.service", "service.tenants.repository", "tenants-repository"),
        ("service.memories.routes", "service.profiles.repository", "profiles-repository"),
    ]:
        changed = copy.deepcopy(graph)
        changed.add_import(importer=importer, imported=repository)
        assert broken_contracts(changed) == [contract], (importer, repository)


def test_service_has_no_import_circle() -> None:
    # Imports under TYPE_CHECKING count too: a circle through them is one refactor away.
    circles = strongly_connected(build_graph(type_checking=True))
    assert circles == []


def test_the_circle_finder_finds_a_circle(graph: grimp.ImportGraph) -> None:
    changed = copy.deepcopy(graph)
    # service.memories.service imports service.errors: the other way round closes a circle.
    changed.add_import(importer="service.errors", imported="service.memories.service")
    [circle] = strongly_connected(changed)
    assert {"service.errors", "service.memories.service"} <= set(circle)


def test_no_service_module_is_imported_inside_a_function_but_the_providers() -> None:
    # The providers' packages import an optional backend only when it is configured.
    allowed = {"service.embedding.__init__", "service.llm.__init__"}
    hidden = [
        f"{i.module}:{i.line} -> {i.imported}" for i in local_imports() if i.module not in allowed
    ]
    assert hidden == []


def test_only_the_queue_names_the_jobs_table_in_sql() -> None:
    # The end hand-over's one statement is composed by queue.repository.enqueue_beside.
    assert measure().jobs_sql == {}
