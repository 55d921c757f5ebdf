"""The layers, held by import-linter rather than by memory (issue 29).

pyproject.toml's ``[tool.importlinter]`` holds the contracts, and each is checked here as
``lint-imports`` checks it. Every import counts: one inside a function, and one under
``if TYPE_CHECKING:`` (a cycle hidden behind it is still a cycle). Each contract is also shown
to break on a planted import, so that one naming what no longer exists, or matching nothing,
cannot pass unnoticed. And no cycle may join two modules, or two packages, of agent, cdi and
discovery: the failure names each one on a line of its own, with the line of every import.
"""

from __future__ import annotations

import copy
import importlib.util
import tomllib
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import api  # noqa: F401 -- importing it sets up import-linter's adapters
from importlinter.application.use_cases import create_report, read_user_options
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.domain.contract import Contract, ContractCheck, registry

from tests.conftest import REPO

PYPROJECT = REPO / "pyproject.toml"
SETTINGS: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
CONTRACT_IDS = [contract["id"] for contract in SETTINGS["contracts"]]
CONTRACT_TYPES: dict[str, type[Contract]] = {
    cls.type_name: cls for cls in (ForbiddenContract, AcyclicSiblingsContract)}
for _name, _cls in CONTRACT_TYPES.items():  # lint-imports registers them as it starts
    registry.register(_cls, _name)
#: Enough of any one tangle to see it; the rest is counted.
MAX_CYCLES_SHOWN = 20


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The import graph ``lint-imports`` builds from the settings, of this checkout."""
    roots = SETTINGS["root_packages"]
    for root in roots:
        spec = importlib.util.find_spec(root)
        origin = Path(spec.origin if spec and spec.origin else "?")
        assert origin.is_relative_to(REPO), f"{root} is imported from {origin}, not {REPO}"
    return grimp.build_graph(
        *roots, include_external_packages=SETTINGS["include_external_packages"],
        exclude_type_checking_imports=SETTINGS["exclude_type_checking_imports"], cache_dir=None)


def _contract(contract_id: str) -> Contract:
    options = read_user_options(str(PYPROJECT))
    [contract_options] = [c for c in options.contracts_options if c["id"] == contract_id]
    cls = CONTRACT_TYPES[contract_options["type"]]
    return cls(name=contract_options["name"], session_options=options.session_options,
               contract_options=contract_options)


def _link(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    """``importer:line`` of its import of ``imported`` (every line, when there are several)."""
    lines = sorted({d["line_number"] for d in graph.get_import_details(
        importer=importer, imported=imported)})
    return f"{importer}:{','.join(map(str, lines))}" if lines else importer


def _violations(check: ContractCheck) -> list[str]:
    """One line per broken chain or cycle, each module with the line of its next import."""
    out = []
    for chains in check.metadata.get("invalid_chains", ()):
        for chain in chains["chains"]:
            links = [f"{c['importer']}:{','.join(map(str, c['line_numbers']))}" for c in chain]
            out.append(" -> ".join([*links, chain[-1]["imported"]]))
    for package, breakers in sorted(check.metadata.get("cycle_breakers_by_package", {}).items()):
        out += [f"in {package}: {importer} -> {imported} closes a cycle"
                for importer, imported in sorted(breakers)]
    return out


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_contract_is_kept(contract_id: str) -> None:
    report = create_report(read_user_options(str(PYPROJECT)), limit_to_contracts=(contract_id,),
                           cache_dir=None)
    assert not report.invalid_contract_options, report.invalid_contract_options
    [(contract, check)] = report.get_contracts_and_checks()
    assert check.kept, f"{contract.name}:\n" + "\n".join(_violations(check))


def _target(graph: grimp.ImportGraph, expression: str, source: str) -> str:
    """One module ``expression`` names, outside ``source`` (a contract skips overlaps)."""
    names = graph.find_matching_modules(expression) if "*" in expression else {expression}
    outside = sorted(n for n in names if n != source and not n.startswith(f"{source}.")
                     and not source.startswith(f"{n}."))
    assert outside, f"{expression} names nothing outside {source}"
    return outside[0]


def _child(package: str, module: str) -> str | None:
    """The child of ``package`` that holds ``module`` (None: not below ``package``)."""
    if not module.startswith(f"{package}."):
        return None
    return f"{package}.{module[len(package) + 1:].split('.', maxsplit=1)[0]}"


def _reverse_of_a_sibling_import(graph: grimp.ImportGraph, package: str) -> tuple[str, str]:
    """An import that closes a cycle between two children of ``package``: the reverse of an
    import one child makes of another."""
    for importer in sorted(graph.find_descendants(package)):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            a, b = _child(package, importer), _child(package, imported)
            if a and b and a != b:
                return imported, importer
    raise AssertionError(f"no child of {package} imports another")


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_contract_breaks_on_a_planted_import(graph: grimp.ImportGraph, contract_id: str) -> None:
    contract = _contract(contract_id)
    options = contract.contract_options
    if options["type"] == "acyclic_siblings":
        before = contract.check(copy.deepcopy(graph), verbose=False)
        for package in options["ancestors"]:
            importer, imported = _reverse_of_a_sibling_import(graph, package)
            planted = copy.deepcopy(graph)
            planted.add_import(importer=importer, imported=imported)
            broken = contract.check(planted, verbose=False).metadata["cycle_breakers_by_package"]
            assert package not in before.metadata["cycle_breakers_by_package"]
            assert package in broken, f"{importer} -> {imported} went unseen in {package}"
        return
    assert options["type"] == "forbidden"
    for source in options["source_modules"]:
        for expression in options["forbidden_modules"]:
            target = _target(graph, expression, source)
            planted = copy.deepcopy(graph)
            planted.add_import(importer=source, imported=target, line_number=1,
                               line_contents=f"import {target}")
            check = contract.check(planted, verbose=False)
            assert not check.kept, f"{source} -> {target} ({expression}) went unseen"
            assert f"{source}:1 -> {target}" in _violations(check)


def _cycles(nodes: Iterable[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The elementary cycles among ``nodes``, each from its least node, sorted: at most
    ``MAX_CYCLES_SHOWN`` of one strongly connected set, and then one ending in "...".
    """
    out: list[list[str]] = []
    for component in _strongly_connected(nodes, edges):
        found: list[list[str]] = []
        for start in sorted(component):
            _walk([start], component, edges, found)
        out += sorted(found)[:MAX_CYCLES_SHOWN]
        if len(found) > MAX_CYCLES_SHOWN:
            out.append([min(component), "...", min(component)])
    return sorted(out)


def _walk(path: list[str], members: set[str], edges: Mapping[str, set[str]],
          found: list[list[str]]) -> None:
    """Every cycle through ``path[0]`` whose other nodes come after it (each cycle once)."""
    for nxt in sorted(edges.get(path[-1], set()) & members):
        if len(found) > MAX_CYCLES_SHOWN:
            return
        if nxt == path[0]:
            found.append([*path, nxt])
        elif nxt > path[0] and nxt not in path:
            _walk([*path, nxt], members, edges, found)


def _strongly_connected(nodes: Iterable[str], edges: Mapping[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one node, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    members = set(nodes)
    for root in sorted(members):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, set()) & members)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, set()) & members))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(component)
    return out


def _ours(graph: grimp.ImportGraph) -> set[str]:
    roots = tuple(SETTINGS["root_packages"])
    return {m for m in graph.modules if m.split(".")[0] in roots}


def test_no_cycle_between_modules(graph: grimp.ImportGraph) -> None:
    modules = _ours(graph)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    cycles = [" -> ".join([*(_link(graph, a, b) for a, b in pairwise(c)), c[-1]])
              for c in _cycles(modules, edges)]
    assert not cycles, f"{len(cycles)} import cycles between modules:\n" + "\n".join(cycles)


def test_no_cycle_between_packages(graph: grimp.ImportGraph) -> None:
    """Children of one package (and the root packages themselves) that import each other,
    through any of their modules; a cycle of plain modules alone is the test above's."""
    modules = _ours(graph)
    packages = {m for m in modules if graph.find_children(m)}
    scopes: dict[str, set[str]] = {"": set(SETTINGS["root_packages"])}
    scopes |= {p: set(graph.find_children(p)) for p in packages}
    lines = []
    for scope, children in sorted(scopes.items()):
        edges: dict[str, set[str]] = {}
        example: dict[tuple[str, str], tuple[str, str]] = {}
        for importer in sorted(modules):
            a = _child(scope, importer) if scope else importer.split(".")[0]
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & modules):
                b = _child(scope, imported) if scope else imported.split(".")[0]
                if a and b and a != b:
                    edges.setdefault(a, set()).add(b)
                    example.setdefault((a, b), (importer, imported))
        for cycle in _cycles(children, edges):
            if not packages & set(cycle):
                continue
            steps = [f"{a} ({_link(graph, *example[a, b])})" for a, b in pairwise(cycle)]
            lines.append(f"in {scope or 'the roots'}: " + " -> ".join([*steps, cycle[-1]]))
    assert not lines, f"{len(lines)} import cycles between packages:\n" + "\n".join(lines)
