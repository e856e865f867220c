"""The shape of ``service``'s imports: cycles, imports that run up the layers, imports hidden
inside functions, routes that reach a repository, ``jobs`` SQL outside the queue, largest files.

    .venv/bin/python bench/import_graph.py            # the figures
    .venv/bin/python bench/import_graph.py --verbose  # and every offending import

The layers, top to bottom: the process (cli; app and MCP; the job wiring; runtime), HTTP (routes,
``service.http``), the domain (services and the rest of an aggregate), repositories, and the
foundations (models, schemas, ``db``, ``queue``, providers, settings). An import from a lower
layer to a higher one is "upward". ``tests/test_architecture.py`` uses the same functions.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "service"

# The process's own modules, top down: the command line, the app and the MCP server, the job
# wiring, the runtime (what one process holds). Then HTTP, the domain, repositories, foundations.
_PROCESS = {
    "__main__": 8,
    "cli": 8,
    "app": 7,
    "mcp_server": 7,
    "apidocs": 7,
    "console": 7,
    "jobs": 6,
    "wiring": 6,
    "runtime": 5,
}
_FOUNDATIONS = {
    "db",
    "queue",
    "embedding",
    "llm",
    "retrieval",
    "settings",
    "errors",
    "guard",
    "observability",
    "context",
    "models",
    "__init__",
}
LAYER_NAMES = {
    8: "cli",
    7: "app",
    6: "wiring",
    5: "runtime",
    3: "http",
    2: "domain",
    1: "repository",
    0: "foundation",
}

# Writes and reads of the job queue's table, outside ``service/queue/``.
_JOBS_SQL = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+jobs\b", re.IGNORECASE)
_JOBS_WRITE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+jobs\b", re.IGNORECASE)


def layer(module: str) -> int:
    """The layer of a module of ``service`` (8 the command line … 0 foundation)."""
    parts = module.split(".")[1:]
    if not parts:
        return 0
    if parts[0] in _PROCESS:
        return _PROCESS[parts[0]]
    if parts[0] == "health" and parts[-1] == "probes":
        return 7
    if parts[0] == "http" or parts[-1] == "routes":
        return 3
    if parts[0] in _FOUNDATIONS:
        return 0
    if parts[-1] in ("models", "schemas", "__init__"):
        return 0
    if parts[-1] == "repository":
        return 1
    return 2


def aggregate(module: str) -> str | None:
    """The package of a module below ``service`` (``service.memories.routes`` → memories)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


@dataclass
class LocalImport:
    """An import statement inside a function body."""

    module: str
    line: int
    imported: str
    under_type_checking: bool = False


@dataclass
class Figures:
    """What the script prints."""

    modules: int = 0
    cycles: list[list[str]] = field(default_factory=list)
    cycles_runtime: list[list[str]] = field(default_factory=list)
    upward: list[tuple[str, str]] = field(default_factory=list)
    local_imports: list[LocalImport] = field(default_factory=list)
    routes_with_repository: dict[str, list[str]] = field(default_factory=dict)
    foreign_repository: list[tuple[str, str]] = field(default_factory=list)
    jobs_sql: dict[str, int] = field(default_factory=dict)
    jobs_writes: dict[str, int] = field(default_factory=dict)
    largest: list[tuple[int, str]] = field(default_factory=list)


def build_graph(*, type_checking: bool = True) -> grimp.ImportGraph:
    """``service``'s import graph; ``type_checking=False`` leaves out imports under
    ``if TYPE_CHECKING:`` (those never run)."""
    return grimp.build_graph(
        PACKAGE, exclude_type_checking_imports=not type_checking, cache_dir=None
    )


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles: groups of two or more modules that all reach each other."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        # Iterative Tarjan: (node, iterator over its successors).
        work: list[tuple[str, Iterator[str]]] = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in edges:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def local_imports() -> list[LocalImport]:
    """Every ``import`` of a ``service`` module written inside a function."""
    found: list[LocalImport] = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    if name == PACKAGE or name.startswith(PACKAGE + "."):
                        found.append(LocalImport(module, node.lineno, name))
    # A function nested in a function is walked twice: keep one of each.
    unique = {(i.module, i.line, i.imported): i for i in found}
    return sorted(unique.values(), key=lambda i: (i.module, i.line))


def measure() -> Figures:
    """All the figures, from the source as it is on disk."""
    graph = build_graph()
    figures = Figures(modules=len(graph.modules))
    figures.cycles = strongly_connected(graph)
    figures.cycles_runtime = strongly_connected(build_graph(type_checking=False))
    runtime_graph = build_graph(type_checking=False)
    for importer in sorted(runtime_graph.modules):
        for imported in sorted(runtime_graph.find_modules_directly_imported_by(importer)):
            if layer(imported) > layer(importer):
                figures.upward.append((importer, imported))
            # The job queue's repository is infrastructure, open to every aggregate.
            if (
                imported.endswith(".repository")
                and aggregate(imported) not in (aggregate(importer), "queue")
                and layer(importer) < 3
            ):
                figures.foreign_repository.append((importer, imported))
            if importer.endswith(".routes") and imported.endswith(".repository"):
                figures.routes_with_repository.setdefault(importer, []).append(imported)
    figures.local_imports = local_imports()
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        source = path.read_text(encoding="utf-8")
        if not relative.startswith(f"{PACKAGE}/queue/"):
            hits = len(_JOBS_SQL.findall(source))
            if hits:
                figures.jobs_sql[relative] = hits
            writes = len(_JOBS_WRITE.findall(source))
            if writes:
                figures.jobs_writes[relative] = writes
        figures.largest.append((source.count("\n"), relative))
    figures.largest = sorted(figures.largest, reverse=True)[:8]
    return figures


def report(figures: Figures, *, verbose: bool = False) -> str:
    """The figures as text."""
    upward_local = [i for i in figures.local_imports if layer(i.imported) > layer(i.module)]
    lines = [
        f"modules                          {figures.modules}",
        f"import circles (all imports)     {len(figures.cycles)}"
        f"  {' | '.join(' '.join(c) for c in figures.cycles)}",
        f"import circles (run-time only)   {len(figures.cycles_runtime)}",
        f"upward imports                   {len(figures.upward)}",
        f"function-local service imports   {len(figures.local_imports)}"
        f" ({len(upward_local)} upward; "
        f"{sum(1 for i in figures.local_imports if i.module != 'service.cli')} outside cli.py)",
        f"route modules with a repository  {len(figures.routes_with_repository)}"
        f" of {_route_modules()}",
        f"imports of another's repository  {len(figures.foreign_repository)} (below HTTP)",
        f"`jobs` SQL outside queue/        {sum(figures.jobs_sql.values())} statements"
        f" in {len(figures.jobs_sql)} files"
        f" ({sum(figures.jobs_writes.values())} writes in {len(figures.jobs_writes)} files)",
        "largest files                    "
        + ", ".join(f"{p.removeprefix('service/')} {n}" for n, p in figures.largest),
    ]
    if verbose:
        lines.append("\nupward imports:")
        lines += [f"  {a} -> {b}" for a, b in figures.upward]
        lines.append("function-local imports:")
        lines += [f"  {i.module}:{i.line} -> {i.imported}" for i in figures.local_imports]
        lines.append("routes importing a repository:")
        lines += [f"  {r}: {', '.join(v)}" for r, v in figures.routes_with_repository.items()]
        lines.append("another aggregate's repository:")
        lines += [f"  {a} -> {b}" for a, b in figures.foreign_repository]
        lines.append("`jobs` SQL outside queue/:")
        lines += [f"  {p}: {n}" for p, n in figures.jobs_sql.items()]
    return "\n".join(lines)


def _route_modules() -> int:
    return len(list((ROOT / PACKAGE).rglob("routes.py")))


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="list every offending import")
    args = parser.parse_args()
    print(report(measure(), verbose=args.verbose))


if __name__ == "__main__":
    main()
