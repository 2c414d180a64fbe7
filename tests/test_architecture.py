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


# Rooms of one concept each: a module that outgrows this holds more than one; a function
# that outgrows that does more than one thing. The training loop gets one screen.
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_LOOP_LINES = 450, 80, 60


def test_modules_and_functions_stay_small():
    import ast

    too_big = []
    for path in sorted([*ROOT.glob("ten/**/*.py"), *ROOT.glob("runner/**/*.py")]):
        src = path.read_text()
        name = path.relative_to(ROOT)
        if len(src.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{name}: {len(src.splitlines())} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                limit = MAX_LOOP_LINES if (str(name), node.name) == (
                    "ten/trainer.py", "_loop") else MAX_FUNCTION_LINES
                if size > limit:
                    too_big.append(f"{name}:{node.lineno} {node.name}: {size} lines")
    assert not too_big, "split these: " + "; ".join(too_big)
