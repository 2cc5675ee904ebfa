"""The library's import graph: no cycles, no module over 400 lines, no module reading another's private names.

Why: a cycle makes the import order decide what works (a module half-initialised when its partner reads it), and
an import hidden inside a function is still an edge of that cycle; a private name is a promise its module never
made. The graph is read from the source (AST), so nothing is imported: bench, models and tasks, every `import`
and `from ... import` at module level and inside functions, relative ones resolved.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "models", "tasks")
NAMESPACE = "golinear."  # installed as golinear.bench, golinear.models, golinear.tasks: the same modules
MAX_LINES = 400


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_files(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """module name -> file, for every .py under the packages."""
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def imports(path: Path, name: str):
    """(line, imported module, names taken from it) for every import statement in the file, at any depth."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name.removeprefix(NAMESPACE), ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            yield node.lineno, base.removeprefix(NAMESPACE), tuple(a.name for a in node.names)


def graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the library modules it imports (`from pkg import mod` is an edge to pkg.mod)."""
    edges = {m: set() for m in files}
    for m, path in files.items():
        for _, target, names in imports(path, m):
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in files]
            if target in files and len(hits) < len(names) or not names and target in files:
                hits.append(target)
            edges[m] |= {h for h in hits if h != m}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def private_uses(files: dict[str, Path]) -> list[str]:
    """`from lib.mod import _name` and `mod._name` (mod an imported library module) across modules."""
    private = lambda n: n.startswith("_") and not n.startswith("__")  # noqa: E731
    found = []
    for m, path in files.items():
        aliases = {}  # local name -> library module it stands for
        for line, target, names in imports(path, m):
            if target.split(".")[0] not in PACKAGES:
                continue
            found += [f"{m}:{line} imports {target}.{n}" for n in names if private(n) and target != m]
            aliases |= {n: f"{target}.{n}" for n in names if f"{target}.{n}" in files}
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname: a.name.removeprefix(NAMESPACE) for a in node.names
                            if a.asname and a.name.removeprefix(NAMESPACE) in files}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and private(node.attr)
                    and isinstance(node.value, ast.Name) and aliases.get(node.value.id, m) != m):
                found.append(f"{m}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    return sorted(found)


# ----------------------------------------------------------------------------- the library
FILES = library_files()


def test_no_import_cycles():
    found = cycles(graph(FILES))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_models_and_tasks_never_import_bench():
    """One direction: the library (models, tasks) knows nothing of the benchmark that reads it."""
    found = [f"{m} -> {d}" for m, deps in graph(FILES).items() if not m.startswith("bench")
             for d in deps if d.startswith("bench")]
    assert not found, "models/tasks importing bench:\n" + "\n".join(found)


BENCH_LAYERS = ("results", "backends", "run", "speed", "boards", "claims", "offline")  # each imports only earlier ones


def test_bench_groups_import_one_way():
    """bench/'s groups in one direction (DESIGN.md's drawing): the store knows no runner, a runner no table, the tables
    no claim. The command modules at bench/'s top (cli, cli_args, quiet, demo) sit outside the order."""
    def group(m):
        parts = m.split(".")
        return parts[1] if parts[0] == "bench" and len(parts) > 2 and parts[1] in BENCH_LAYERS else None
    found = [f"{m} -> {d}" for m, deps in graph(FILES).items() for d in deps
             if group(m) and group(d) and BENCH_LAYERS.index(group(d)) > BENCH_LAYERS.index(group(m))]
    assert not found, "bench groups importing a later group:\n" + "\n".join(found)
    assert {p.name for p in (ROOT / "bench").iterdir() if (p / "__init__.py").is_file()} == set(BENCH_LAYERS)


def test_no_module_over_400_lines():
    sizes = {m: len(p.read_text().splitlines()) for m, p in FILES.items()}
    over = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def test_no_private_names_of_other_modules():
    found = private_uses(FILES)
    assert not found, "private names used across modules:\n" + "\n".join(found)


# ----------------------------------------------------------------------------- the checks themselves
@pytest.fixture
def toy(tmp_path):
    """A package whose a -> b edge is at module level and b -> a inside a function; c reads a's private name."""
    pkg = tmp_path / "bench"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from bench.sub import b\n_hidden = 1\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text("import bench.a as A\nfrom bench.a import _hidden\nx = A._hidden\n")
    (pkg / "d.py").write_text("from bench.sub import b\n" + "x = 1\n" * MAX_LINES)
    return library_files(tmp_path, ("bench",))


def test_graph_sees_imports_inside_functions_and_relative_ones(toy):
    edges = graph(toy)
    assert edges["bench.a"] == {"bench.sub.b"} and edges["bench.sub.b"] == {"bench.a"}
    assert edges["bench.d"] == {"bench.sub.b"} and edges["bench.c"] == {"bench.a"}
    assert cycles(edges) == [["bench.a", "bench.sub.b"]]


def test_graph_resolves_absolute_imports_of_modules_and_names(toy):
    toy["bench.sub.b"].write_text("def f():\n    import bench.a\n    from bench.a import _hidden\n")
    assert graph(toy)["bench.sub.b"] == {"bench.a"} and cycles(graph(toy)) == [["bench.a", "bench.sub.b"]]
    toy["bench.sub.b"].write_text("x = 1\n")
    assert cycles(graph(toy)) == []


def test_namespaced_imports_are_the_same_modules(toy):
    toy["bench.sub.b"].write_text("def f():\n    from golinear.bench import a\n")
    toy["bench.c"].write_text("import golinear.bench.a as A\nx = A._hidden\n")
    assert cycles(graph(toy)) == [["bench.a", "bench.sub.b"]]
    assert private_uses(toy) == ["bench.c:2 reads bench.a._hidden"]


def test_size_check_counts_lines(toy):
    assert [m for m, p in toy.items() if len(p.read_text().splitlines()) > MAX_LINES] == ["bench.d"]


def test_private_checks_find_both_forms(toy):
    assert private_uses(toy) == ["bench.c:2 imports bench.a._hidden", "bench.c:3 reads bench.a._hidden"]
