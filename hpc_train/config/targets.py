"""The ``_target_`` s a config may name under ``hpc_train.``: the public names (``PUBLIC_TARGETS``), the arguments
of the shipped ones (torchvision ResNets, ``toy_mlp``, the digits, synthetic and image-folder datasets: checked where
a model or data node names one; a user's own ``_target_`` is checked when the job starts,
``hpc_train/compute/user/building.py``), and whether a ``hpc_train.`` path names anything (``missing_target``).

Tables and the package's source read with ``ast``, not ``inspect.signature`` or an import: the login side never
imports torch. A unit test compares the tables with the real functions (tests/unit/test_target_args.py, which may
import torch).
"""

from __future__ import annotations

import ast
import difflib
from functools import lru_cache
from pathlib import Path
from typing import FrozenSet, Optional, Tuple

from hpc_train.config.checks import PATH_TEXT, flag, number, one_of, whole

# What a user names in a config, by its public name (a module of its own at the package's top, which stays where it
# is whatever the layout inside), -> where it is defined. The internal paths keep working (they were documented).
PUBLIC_TARGETS = {
    "hpc_train.steps.model_loss": "hpc_train.compute.training.steps.model_loss",
    "hpc_train.models.toy_mlp": "hpc_train.compute.models.toy_mlp",
    "hpc_train.datasets.digits": "hpc_train.compute.datasets.digits",
    "hpc_train.datasets.synthetic": "hpc_train.compute.datasets.synthetic",
    "hpc_train.datasets.image_folder": "hpc_train.compute.datasets.image_folder",
}
_PUBLIC_OF = {internal: public for public, internal in PUBLIC_TARGETS.items()}


def public_name(target: str) -> str:
    """The public name of a shipped target named by its internal path; any other target as it is."""
    return _PUBLIC_OF.get(target, target)


_CLASSES = (whole(1), 10, "The number of classes (the model's output size).")
_IMAGE = {"image_size": (whole(1, 65536), 32, "The side of the square images.")}
_RESNETS = {f"torchvision.models.resnet{n}": {"num_classes": _CLASSES} for n in (18, 34, 50, 101, 152)}
# Arguments of the shipped _target_s, checked where a node names one (a user's own: at job start):
# argument -> (check, example, one-line doc).
TARGET_ARGS = {
    **_RESNETS,
    "hpc_train.models.toy_mlp": {
        **_IMAGE,
        "num_classes": _CLASSES,
        "hidden": (whole(1), 64, "The hidden layer's width."),
        "in_channels": (whole(1), 3, "Channels of the input images."),
    },
    "hpc_train.datasets.digits": {
        "split": (one_of("train", "val"), "train", "Which split this node reads."),
        **_IMAGE,
        "val_fraction": (number(0, 1, True, True), 0.2, "The fraction held out for validation (a fixed split)."),
    },
    "hpc_train.datasets.synthetic": {
        "num_samples": (whole(1), 1024, "Samples generated (once, held in memory)."),
        **_IMAGE,
        "num_classes": _CLASSES,
        "seed": (whole(0, 2**32 - 1), 1, "The seed of the generated images and labels."),
    },
    "hpc_train.datasets.image_folder": {
        "root": (PATH_TEXT, "/path/to/dataset", "The folder holding the splits."),
        "split": (PATH_TEXT, "train", "The split's folder under root (one sub-folder per class)."),
        **_IMAGE,
        "augment": (flag, "true", "Random resized crops and flips."),
    },
}
TARGET_NODES = ("model", "data.train", "data.val")


# -- does a hpc_train. path name anything? (read from the source with ast: no import, no torch) -----------------------
_PACKAGE = Path(__file__).resolve().parent.parent  # hpc_train/


def _module_file(dotted: str) -> Optional[Path]:
    """The source file of the hpc_train module `dotted` (a package's __init__.py), None when there is none."""
    base = _PACKAGE.joinpath(*dotted.split(".")[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _bound_names(statements) -> set:
    names: set = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # names bound under a top-level if or try
            blocks = [node.body, node.orelse, getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            names |= _bound_names([n for block in blocks for n in block])
    return names


@lru_cache(maxsize=None)
def _top_level_names(path: Path) -> Tuple[FrozenSet[str], bool]:
    """The names a module binds at its top level, and whether it has a module __getattr__ (PEP 562)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _bound_names(tree.body)
    if "__getattr__" not in names:
        return frozenset(names), False
    for node in tree.body:  # a module __getattr__: the names it serves are those of __all__
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                names |= set(ast.literal_eval(node.value))
            except ValueError:
                return frozenset(names), True
    return frozenset(names), False


def _submodules(dotted: str) -> set:
    path = _module_file(dotted)
    if path is None or path.name != "__init__.py":
        return set()
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in path.parent.iterdir()
        if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").is_file())
    }


def missing_target(target: str) -> Optional[Tuple[str, Optional[str]]]:
    """For a `_target_` under hpc_train. that names no class or function: (what is wrong, the closest name there is);
    None when it names one (or is not under hpc_train.). Read from the source, without importing it."""
    if not target.startswith("hpc_train.") or target in PUBLIC_TARGETS or target in _PUBLIC_OF:
        return None
    parts = target.split(".")
    module = parts[0]
    for part in parts[1:]:
        names, anything = _top_level_names(_module_file(module))
        if part in _submodules(module):
            module = f"{module}.{part}"
            continue
        if part in names or anything:
            return None  # an attribute of a module (what lies inside it is known only by importing it)
        known = {f"{module}.{n}" for n in names | _submodules(module) if not n.startswith("_")}
        close = difflib.get_close_matches(target, sorted(set(PUBLIC_TARGETS) | known), n=1, cutoff=0.8)
        return f"{module} has no `{part}`", (public_name(close[0]) if close else None)
    close = difflib.get_close_matches(target, sorted(PUBLIC_TARGETS), n=1, cutoff=0.8)
    return f"{target} is a module, not a class or function", (close[0] if close else None)
