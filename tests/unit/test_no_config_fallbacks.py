"""No fallback for a configuration key on the rank side.

Every declared key's default is written once, in its declaration (hpc_train.config); the login side
fills it into the job spec, and a rank reads it from its typed settings. A rank module that
supplies a value of its own for a declared key (``node.get("dir") or "."``,
``cfg.get("keep", 1)``, ``getattr(settings, "lr", 0.1)``, ``OmegaConf.select(cfg, "logger.mode",
default=None)``) would be a second default, silently different from the declared one.

This scan of hpc_train/compute/** reads the code, not the running values: a read counts as one of
the configuration when what it reads from is named like a config section (``trainer``, ``logger``,
..., the spec's ``job``) or a configuration (``cfg``, ``spec``, ``settings``, ``node``, ...).
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

from hpc_train.compute.settings import JobSettings
from hpc_train.config import RULES
from hpc_train.contracts.job_layout import JobLayout
from tests.support.paths import REPO

COMPUTE = REPO / "hpc_train" / "compute"
SECTIONS = {rule.key.split(".")[0] for rule in RULES if "." in rule.key} | {"job", "layout"}
CONFIG_NAME = re.compile(r"(cfg|spec|settings|config|node|section)$", re.IGNORECASE)


def declared_names() -> Set[str]:
    """The last part of every declared key, and the keys of the job section the launch side writes."""
    names = {rule.key.split(".")[-1] for rule in RULES if not rule.key.endswith("*")}
    return names | {f.name for f in fields(JobSettings)} | {f.name for f in fields(JobLayout)} | {"world_size"}


def _last_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _last_name(node.value)
    if isinstance(node, ast.Call):
        return _last_name(node.func)
    return None


def _is_config(node: ast.AST) -> bool:
    name = _last_name(node)
    return name is not None and (name in SECTIONS or bool(CONFIG_NAME.search(name)))


def _text(node: ast.AST) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _read_key(node: ast.AST, names: Set[str]) -> Optional[str]:
    """The declared key `node` reads from a configuration, if it is such a read: X.key, X["key"], X.get("key")."""
    if isinstance(node, ast.Attribute) and node.attr in names and _is_config(node.value):
        return node.attr
    if isinstance(node, ast.Subscript) and _text(node.slice) in names and _is_config(node.value):
        return _text(node.slice)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = _text(node.args[0])
        if key in names and _is_config(node.func.value):
            return key
    return None


def fallbacks(source: str, names: Set[str]) -> List[str]:
    """'line N: what' for every fallback for a declared key in a module's source, in line order."""
    return [problem for _, problem in sorted(_fallbacks(source, names), key=lambda found: found[0])]


def _fallbacks(source: str, names: Set[str]) -> Iterator[Tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get":
                key = _read_key(node, names)
                if key is not None:  # .get() itself is the fallback: None, or its second argument
                    yield node.lineno, f"line {node.lineno}: .get({key!r}) on a configuration"
            elif isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
                key = _text(node.args[1])
                if key in names and _is_config(node.args[0]):
                    yield node.lineno, f"line {node.lineno}: getattr(..., {key!r}, default)"
            elif isinstance(func, ast.Attribute) and func.attr == "select" and len(node.args) >= 2:
                path = _text(node.args[1]) or ""
                if any(k.arg == "default" for k in node.keywords) and path.split(".")[0] in SECTIONS:
                    yield node.lineno, f"line {node.lineno}: select({path!r}, default=...)"
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            for value in node.values[:-1]:
                key = _read_key(value, names)
                if key is not None and not isinstance(value, ast.Call):  # a .get() is reported above
                    yield node.lineno, f"line {node.lineno}: {key} or <default>"


def compute_modules() -> List[Path]:
    return sorted(COMPUTE.rglob("*.py"))


def test_no_rank_module_falls_back_for_a_declared_key():
    names = declared_names()
    found = [
        f"{path.relative_to(REPO)} {problem}"
        for path in compute_modules()
        for problem in fallbacks(path.read_text(), names)
    ]
    assert not found, "a default of its own for a declared key (declare it in hpc_train/config instead):\n" + "\n".join(
        found
    )


def test_the_scan_finds_each_kind_of_fallback():
    names = declared_names()
    source = "\n".join(
        [
            "a = node.get('dir') or '.'",
            "b = cfg.trainer.get('keep_checkpoints', 1)",
            "c = getattr(settings, 'lr', 0.1)",
            "d = OmegaConf.select(cfg, 'launcher.name', default=None)",
            "e = self.settings.wrap or []",
            "f = cfg.job.get('code_dirs') or []",
            "g = data_cfg['num_workers'] or 0",
        ]
    )
    assert [line.split(":")[0] for line in fallbacks(source, names)] == [f"line {n}" for n in range(1, 8)]


def test_reads_that_are_no_fallback_pass():
    names = declared_names()
    source = "\n".join(
        [
            "a = record.get('step')",  # a metrics row, not a configuration
            "b = os.environ.get('OMP_NUM_THREADS') or layout.cpus_per_task",  # the environment first
            "c = getattr(output, 'loss', None)",  # a model's output
            "d = run_label(run_dir) if settings.run_name is None else settings.run_name",  # what null means
            "e = node.get('_target_')",  # not a declared key
        ]
    )
    assert fallbacks(source, names) == []
