"""No module of the package is over 600 lines: a module that grows past it holds more than one job.

The figure is the project's rule (docs/contributing.md); the test reads every module of ``hpc_train/`` and of
``hydra_plugins/``, and shows itself able to fail on a copy of a long module in a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 600


def _too_long(root: Path) -> List[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MOST_LINES:
            found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_no_module_is_over_600_lines():
    assert _too_long(ROOT / "hpc_train") + _too_long(ROOT / "hydra_plugins") == []


def test_the_check_finds_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MOST_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MOST_LINES + 1))
    assert _too_long(tmp_path) == [f"long.py: {MOST_LINES + 1} lines"]
