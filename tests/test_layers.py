"""Guards on the package's shape, read from the source with `ast` (nothing is imported):
the engine and the mapper never import the trainer or the CLI, hflow's modules import each
other without a cycle, and files and functions stay within the size budget (STYLE.md, 7).

Every import counts, at module level and inside functions: a function-level import still
makes the importer depend on the imported module."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_PACKAGE = {"tests", "benchmarks", "docker", "build", "docs"}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _skipped(rel: Path, excluded: set[str]) -> bool:
    dirs = rel.parts[:-1]
    return any(d in excluded or d.startswith(".") or d.endswith(".egg-info") for d in dirs)


def package_files() -> list[Path]:
    """Every .py file of the package: the repo root minus tests/, .venv/ (any hidden folder),
    benchmarks/, docker/, build/, docs/ (the site and its scripts) and *.egg-info."""
    return sorted(p for p in ROOT.rglob("*.py") if not _skipped(p.relative_to(ROOT), NOT_PACKAGE))


def suite_files() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("*.py")
                  if not _skipped(p.relative_to(ROOT / "tests"), set()))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = ["hflow", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    text: str  # the import statement as written
    target: str  # the hflow module it loads


def _longest_known(name: str, modules: set[str]) -> str:
    """`name` if it is a module, else its longest prefix that is (an import of a name that is
    not a module still runs the package that holds it)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a `from ... import` names, resolving relative imports."""
    if not node.level:
        return node.module or ""
    package = importer if is_package else importer.rsplit(".", 1)[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> list[Import]:
    """The hflow modules `path` imports. `import hflow.a.b` -> hflow.a.b; `from hflow.a import b`
    -> hflow.a.b when that is a module, else hflow.a (b is a name defined in hflow.a)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    importer, is_package = module_name(path, root), path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, importer, is_package)
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                     for a in node.names]
        else:
            continue
        for name in names:
            if name == "hflow" or name.startswith("hflow."):
                found.append(Import(path, node.lineno, ast.unparse(node), _longest_known(name, modules)))
    return found


def import_graph(files: list[Path]) -> tuple[dict[str, set[str]], dict[tuple[str, str], Import]]:
    """Module -> modules it imports, and for each edge one import that makes it.

    Only edges to modules as named: `import hflow.a.b` also runs hflow/a/__init__.py, but such an
    implicit edge to a parent package cannot close a cycle that Python fails on (the parent is
    already in sys.modules while its children load), so it is left out."""
    modules = {module_name(p) for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    where: dict[tuple[str, str], Import] = {}
    for path in files:
        importer = module_name(path)
        for imp in imports_of(path, modules):
            graph[importer].add(imp.target)
            where.setdefault((importer, imp.target), imp)
    return graph, where


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a chain [a, b, ..., a], or None when the graph is acyclic (depth-first search;
    a node met again while still on the current path closes a cycle)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        on_path.discard(path.pop())
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)):
            return cycle
    return None


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the checker checks itself -------------------------------------------------------------


def test_find_cycle_on_small_graphs():
    diamond = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert find_cycle(diamond) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    # the cycle is reported from where it closes, not from where the search began
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_imports_are_resolved_to_modules(tmp_path):
    (tmp_path / "eng").mkdir()
    user = tmp_path / "eng" / "user.py"
    user.write_text("import os\nimport hflow.eng.sub\nfrom hflow import top\n"
                    "from hflow.eng import helper_name\n"
                    "def f():\n    from . import sub\n    from ..top import thing\n")
    modules = {"hflow", "hflow.eng", "hflow.eng.sub", "hflow.eng.user", "hflow.top"}
    found = [(i.line, i.target) for i in imports_of(user, modules, root=tmp_path)]
    assert found == [(2, "hflow.eng.sub"), (3, "hflow.top"), (4, "hflow.eng"),
                     (6, "hflow.eng.sub"), (7, "hflow.top")]


# -- the checks ----------------------------------------------------------------------------


def test_engine_and_mapper_never_import_trainer_or_cli():
    files = package_files()
    modules = {module_name(p) for p in files}
    lower = [p for p in files if p.relative_to(ROOT).parts[0] in {"engine", "mapper"}]
    assert lower, "found no engine/ or mapper/ files: is ROOT right?"
    bad = [f"{_rel(i.path)}:{i.line}: {i.text}" for p in lower for i in imports_of(p, modules)
           if i.target.split(".")[:2] in (["hflow", "trainer"], ["hflow", "cli"])]
    assert not bad, "engine/ and mapper/ must not import hflow.trainer or hflow.cli:\n" + "\n".join(bad)


def test_no_import_cycle():
    graph, where = import_graph(package_files())
    cycle = find_cycle(graph)
    if cycle:
        hops = [f"  {_rel(where[a, b].path)}:{where[a, b].line}: {where[a, b].text}"
                for a, b in zip(cycle, cycle[1:])]
        pytest.fail("import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(hops))


# Inside a package, sub-packages import one way: each may import its own floor and the floors
# below it, never one above. "" is the package's own modules (engine/columns.py, trainer/stop.py):
# the ground floor every sub-package stands on.
FLOORS = {
    "engine": ["", "kernels", "rlmath", "groups", "models", "training", "rollout", "workers"],
    "trainer": ["", "config", "data", "rundir", "report", "placement", "work", "streaming", "control", "algorithms", "api"],
}


def _floor(module: str, package: str) -> str | None:
    """The floor of `module` inside hflow.`package`, or None when it lies outside the package."""
    parts = module.split(".")
    if parts[:2] != ["hflow", package] or len(parts) < 3:
        return None
    return parts[2] if len(parts) > 3 else ""


def upward_imports(files: list[Path], modules: set[str], floors: dict[str, list[str]],
                   root: Path = ROOT) -> list[str]:
    """Every import that points up a package's floors (or into a sub-package no floor names)."""
    bad = []
    for path in files:
        importer = module_name(path, root)
        for package, order in floors.items():
            here = _floor(importer, package)
            if here is None:
                continue
            for imp in imports_of(path, modules, root):
                there = _floor(imp.target, package)
                if there is None or there == here:
                    continue
                if here not in order or there not in order or order.index(there) > order.index(here):
                    bad.append(f"{path.relative_to(root)}:{imp.line}: {imp.text}  "
                               f"({package}: {here or 'ground floor'} -> {there or 'ground floor'})")
    return bad


def test_upward_imports_are_found(tmp_path):
    for folder in ("low", "high"):
        (tmp_path / "pkg" / folder).mkdir(parents=True)
    (tmp_path / "pkg" / "base.py").write_text("from hflow.pkg.high import h\n")
    (tmp_path / "pkg" / "low" / "l.py").write_text("import hflow.pkg.base\n")
    (tmp_path / "pkg" / "high" / "h.py").write_text("def f():\n    from hflow.pkg.low import l\n")
    files = sorted((tmp_path / "pkg").rglob("*.py"))
    modules = {module_name(p, tmp_path) for p in files} | {"hflow.pkg", "hflow.pkg.low", "hflow.pkg.high"}
    found = upward_imports(files, modules, {"pkg": ["", "low", "high"]}, root=tmp_path)
    assert found == ["pkg/base.py:1: from hflow.pkg.high import h  (pkg: ground floor -> high)"]
    assert len(upward_imports(files, modules, {"pkg": ["", "high", "low"]}, root=tmp_path)) == 2


def test_sub_packages_import_one_way():
    files = package_files()
    for package, order in FLOORS.items():
        found = {p.relative_to(ROOT / package).parts[0] for p in files
                 if p.relative_to(ROOT).parts[0] == package and len(p.relative_to(ROOT / package).parts) > 1}
        assert found == set(order[1:]), f"{package}/'s sub-packages {sorted(found)} are not all in FLOORS"
    bad = upward_imports(files, {module_name(p) for p in files}, FLOORS)
    assert not bad, ("an import points up a package's floors (FLOORS: ground floor first); move the "
                     "shared piece down instead:\n" + "\n".join(bad))


def test_files_under_line_budget():
    long = [f"{_rel(p)}: {n} lines" for p in package_files()
            if (n := len(p.read_text().splitlines())) >= MAX_FILE_LINES]
    assert not long, f"files must stay under {MAX_FILE_LINES} lines; split these:\n" + "\n".join(long)


def long_functions(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n >= MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {node.name} is {n} lines")
    return found


def test_function_length_counts_def_to_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(57))
    (tmp_path / "a.py").write_text(f"@decorator\ndef short():\n{body}\n    return 0\n\n"
                                   f"async def long():\n{body}\n    y = 1\n    return y\n")
    found = long_functions([tmp_path / "a.py"], root=tmp_path)
    assert found == ["a.py:62: long is 60 lines"]  # short is 59 lines: def, 57 lines, return


@pytest.mark.parametrize("where", ["package", "tests"])
def test_functions_under_line_budget(where):
    long = long_functions(package_files() if where == "package" else suite_files())
    assert not long, (f"functions must stay under {MAX_FUNCTION_LINES} lines (def to last line); "
                      "split these:\n" + "\n".join(long))
