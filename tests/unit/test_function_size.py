"""No function of the package is over 60 lines: a longer one does several things, which read better as named steps
(the way ``Trainer.fit`` reads as a list of calls).

The figure is the project's rule (docs/architecture.md, "The code's shape, held by tests"); the test reads every
function and method of ``hpc_train/`` and of ``hydra_plugins/`` with ``ast`` (from its ``def`` line to its last
line, its docstring and comments included), and shows itself able to fail on a long function in a temporary
folder."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 60


def _too_long(root: Path) -> List[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MOST_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_function_is_over_60_lines():
    assert _too_long(ROOT / "hpc_train") + _too_long(ROOT / "hydra_plugins") == []


def test_the_check_finds_a_long_function(tmp_path):
    (tmp_path / "short.py").write_text("def short():\n" + "    x = 1\n" * (MOST_LINES - 1))
    (tmp_path / "long.py").write_text("class C:\n    def long(self):\n" + "        x = 1\n" * MOST_LINES)
    assert _too_long(tmp_path) == [f"long.py:2 long: {MOST_LINES + 1} lines"]
