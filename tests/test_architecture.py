"""ARCHITECTURE.md stays true: every module and folder it names exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_named_in_architecture_md_exists():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"\b((?:ten|runner|tests)/[A-Za-z0-9_/]*(?:\.py|/))", text))
    assert len(named) > 20  # the map names most of the tree
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"ARCHITECTURE.md names what does not exist: {missing}"


def _imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_layer_tree_is_the_import_graph():
    """In the map's tree a module drawn under another is one that other one uses: it
    imports it, or (a folder of files shipped as data) names the folder. A map that
    hangs a module under the wrong parent fails here, not only one naming a lost file."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    tree = re.search(r"## Layers\n\n```\n(.*?)```", text, re.S).group(1)
    edges, parent = [], None
    for line in tree.splitlines():
        m = re.match(r"^(  [├└]─ |  │    [├└]─ )((?:ten|runner)/[\w/]*(?:\.py|/))", line)
        if m is None:
            continue
        if "│" in m.group(1):
            edges.append((parent, m.group(2)))
        else:
            parent = m.group(2)
    assert len(edges) >= 10
    wrong = []
    for parent, child in edges:
        files = [ROOT / parent] if parent.endswith(".py") else sorted((ROOT / parent).rglob("*.py"))
        used = set().union(*map(_imports_of, files))
        module = child.removesuffix(".py").rstrip("/").replace("/", ".")
        shipped = child.endswith("/") and any(f'"{Path(child).name}"' in f.read_text()
                                              for f in files)
        if not shipped and not any(u == module or u.startswith(module + ".") for u in used):
            wrong.append(f"{child} under {parent}")
    assert not wrong, f"drawn under a module that does not use it: {wrong}"


def _module_graph(top: str) -> dict[str, set[str]]:
    """Every module of ``top`` (ten or runner) and the project's modules it imports, at
    the top or inside a function (a lazy import is still an arrow). ``from pkg import
    mod`` is an arrow to ``pkg.mod``, ``from pkg import name`` to ``pkg``; an import under
    ``if TYPE_CHECKING:`` names a type for the reader and runs nothing: no arrow."""
    import ast

    def name_of(path: Path) -> str:
        parts = path.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name_of(p): p for t in ("ten", "runner") for p in (ROOT / t).rglob("*.py")}

    def resolve(name: str) -> str | None:  # "ten.kernels.scan.scan_ref" -> "ten.kernels.scan"
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    def arrows(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                node.body = []
        named: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                          else node.module for a in node.names}
        return {r for u in named if (r := resolve(u))}

    return {m: arrows(p) - {m} for m, p in files.items() if m == top or m.startswith(top + ".")}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# Each package's floors, lowest first. A module imports its own part (a package or a
# top-level module) and the floors below it, nothing beside or above: in ten, model and
# data stand side by side and never import each other; in runner, storage knows no job.
FLOORS = {
    "ten": (
        ("ten.config", "ten.fileio", "ten.cards", "ten.text"),
        ("ten.kernels",),
        ("ten.model", "ten.data"),
        ("ten.train",),
        ("ten",),  # the package's public names (ten.load_run)
    ),
    "runner": (
        ("runner.exit_codes", "runner.keys"),
        ("runner.errors",),
        ("runner.storage", "runner.preemption", "runner.launch"),
        ("runner.job",),
        ("runner.monitor", "runner.trained"),
        ("runner.provision",),
        ("runner.run",),
        ("runner.target",),
        ("runner.cli",),
        ("runner",),
    ),
}


def _part_of(module: str) -> str:
    """The package or top-level module a module belongs to: ten.kernels.scan -> ten.kernels."""
    return ".".join(module.split(".")[:2])


@pytest.mark.parametrize("top", sorted(FLOORS))
def test_imports_run_only_downward_by_the_floors(top):
    floor = {part: i for i, parts in enumerate(FLOORS[top]) for part in parts}
    graph = _module_graph(top)
    parts = {_part_of(m) for m in graph}
    assert parts == set(floor), f"a part of {top} is on no floor (or a floor names none): " \
                                f"{sorted(parts ^ set(floor))}"
    upward = sorted(f"{m} -> {u}" for m, used in graph.items() for u in used
                    if u.startswith(top) and _part_of(u) != _part_of(m)
                    and floor[_part_of(u)] >= floor[_part_of(m)])
    assert not upward, f"{top} imports beside or above its floor: {upward}"


def test_ten_has_at_most_six_top_level_modules():
    modules = sorted(p.name for p in (ROOT / "ten").glob("*.py"))
    assert len(modules) <= 6, modules


@pytest.mark.parametrize("top", ["ten", "runner"])
def test_no_module_imports_itself_back(top):
    assert _circles(_module_graph(top)) == []


@pytest.mark.parametrize("top", ["ten", "runner"])
def test_each_test_folder_is_named_for_the_package_it_tests(top):
    folders = [d.name for d in (ROOT / "tests" / top).iterdir()
               if d.is_dir() and d.name != "__pycache__"]
    assert folders
    strays = [f for f in folders if not (ROOT / top / f / "__init__.py").is_file()]
    assert not strays, f"tests/{top}/ folders that name no package of {top}: {strays}"
