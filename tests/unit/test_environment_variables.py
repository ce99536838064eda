"""Each environment variable hpc_train sets or reads is named in one place: a module's constant that every other
module reads, so the side that sets a variable and the side that reads it cannot drift apart."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"HPC_TRAIN_[A-Z0-9_]+")


def test_every_hpc_train_variable_is_spelled_in_one_place():
    places: Dict[str, List[str]] = defaultdict(list)
    for path in sorted([*(ROOT / "hpc_train").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.fullmatch(node.value):
                places[node.value].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert places, "no variable found: the scan reads nothing"
    twice = {name: where for name, where in places.items() if len(where) > 1}
    assert not twice, f"spelled in more than one place (define it once, import it elsewhere): {twice}"
