"""Every rename in hpc_train goes through the one atomic writer (records/rundir.py) or, for a checkpoint directory,
compute/checkpointing/dcp_dirs.py: a hand-rolled temporary-and-rename writer elsewhere is found in the source.

A copy with a fixed temporary name (``path + ".tmp"``) is the bug the writer's names fixed: in containers every
rank's first process is pid 1, and two writers' renames took each other's file away. The scan reads the code (an
AST walk of every module): ``os.replace``, ``os.rename``, ``os.renames``, ``shutil.move``, those names imported
bare, and ``.rename(...)`` / ``.replace(target)`` on a path (one argument: ``str.replace`` takes two).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Iterator, List, Tuple

from tests.support.paths import SRC

ALLOWED = ("hpc_train/records/rundir.py", "hpc_train/compute/checkpointing/dcp_dirs.py")
_MODULE_CALLS = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move")}
_NOT_PATHS = ("dataclasses",)  # dataclasses.replace(record) with no change is one argument too


def _receiver(func: ast.Attribute) -> str:
    return func.value.id if isinstance(func.value, ast.Name) else ""


def _renames(tree: ast.AST) -> Iterator[Tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            for alias in node.names:
                if (node.module, alias.name) in _MODULE_CALLS:
                    yield node.lineno, f"from {node.module} import {alias.name}"
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, _receiver(node.func)
        if (receiver, name) in _MODULE_CALLS:
            yield node.lineno, f"{receiver}.{name}"
        elif name in ("rename", "renames") and receiver not in ("os", *_NOT_PATHS):
            yield node.lineno, f".{name}()"
        elif name == "replace" and len(node.args) == 1 and not node.keywords and receiver not in _NOT_PATHS:
            yield node.lineno, ".replace(target)"


def hand_rolled_renames(root: Path) -> List[str]:
    """``path:line what`` for each rename in `root`/hpc_train outside the writer and dcp_dirs."""
    found = []
    for path in sorted((root / "hpc_train").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in ALLOWED:
            continue
        found += [f"{name}:{line} {what}" for line, what in sorted(_renames(ast.parse(path.read_text())))]
    return found


def test_every_rename_goes_through_the_one_writer_or_dcp_dirs():
    found = hand_rolled_renames(SRC)
    assert not found, (
        "a rename outside hpc_train/records/rundir.py (write_atomic, replace_atomic, link_atomic) and"
        " compute/checkpointing/dcp_dirs.py; write the record through the writer instead:\n" + "\n".join(found)
    )


HAND_ROLLED = """

def write_link_by_hand(local_dir, text):
    tmp = local_dir / "remote.json.tmp"
    tmp.write_text(text)
    os.replace(tmp, local_dir / "remote.json")


def more_by_hand(partial, target, link):
    partial.replace(target)
    os.rename(partial, target)
    Path(partial).rename(target)
    shutil.move(partial, target)
    from os import replace
    link.name.replace(".json", "")  # a string's: not a rename
    dataclasses.replace(target)  # a record's copy: not a rename
"""


def test_the_scan_finds_a_hand_rolled_writer_in_a_copy_of_the_package(tmp_path):
    """A copy of hpc_train (the source tree is never written), with the remote link's old writer put back into one
    module and each other way to rename beside it: every one is found, in the module and at the line it is."""
    shutil.copytree(
        SRC / "hpc_train", tmp_path / "hpc_train", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    assert hand_rolled_renames(tmp_path) == []
    module = tmp_path / "hpc_train" / "remote" / "settings.py"
    first = len(module.read_text().splitlines()) + 1
    module.write_text(module.read_text() + HAND_ROLLED)
    allowed = tmp_path / "hpc_train" / "records" / "rundir.py"
    allowed.write_text(allowed.read_text() + HAND_ROLLED)  # the writer itself may rename
    lines = HAND_ROLLED.splitlines()
    expected = [
        (first + lines.index('    os.replace(tmp, local_dir / "remote.json")'), "os.replace"),
        (first + lines.index("    partial.replace(target)"), ".replace(target)"),
        (first + lines.index("    os.rename(partial, target)"), "os.rename"),
        (first + lines.index("    Path(partial).rename(target)"), ".rename()"),
        (first + lines.index("    shutil.move(partial, target)"), "shutil.move"),
        (first + lines.index("    from os import replace"), "from os import replace"),
    ]
    assert hand_rolled_renames(tmp_path) == [f"hpc_train/remote/settings.py:{n} {what}" for n, what in expected]


def tar_extractions(root: Path) -> List[str]:
    """``path:line`` of each ``.extract(...)`` or ``.extractall(...)`` call in `root`/hpc_train: tarfile's, which
    write a file in place."""
    found = []
    for path in sorted((root / "hpc_train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("extract", "extractall"):
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return found


def test_a_tar_stream_is_unpacked_only_through_the_writer():
    """tarfile's extract writes each file in place, so a reader of a mirrored summary.json (or of a synced module)
    could see half of it: remote/serve.receive writes each member through the writer instead."""
    found = tar_extractions(SRC)
    assert not found, "unpack a tar stream with hpc_train.remote.serve.receive (each file whole):\n" + "\n".join(found)
