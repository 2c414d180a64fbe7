"""ARCHITECTURE.md stays true: every module and folder it names exists."""

import re
from pathlib import Path

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
