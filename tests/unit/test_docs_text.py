"""The docs' text: the README's and pages' links exist, dry-run examples are marked, and the architecture page names
every module and package."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.support.paths import REPO as ROOT

MARK = re.compile(r"^<!-- test: dry-run(?: cwd=(?P<cwd>\S+))? -->\s*$")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commands(block: str) -> list[str]:
    """The shell commands of a code block: continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        words = shlex.split(current, comments=True)
        if words:
            out.append(shlex.join(words))
        current = ""
    return out


def marked_examples() -> list[tuple[str, str, str]]:
    """(where, cwd, command) for every command of every marked block."""
    found = []
    for path in doc_files():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARK.match(line)
            if not m:
                continue
            assert i + 1 < len(lines) and lines[i + 1].startswith("```"), (
                f"{path}:{i + 1}: no code block after the mark"
            )
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            for cmd in commands("\n".join(lines[i + 2 : end])):
                if cmd.startswith("cd "):  # the mark's cwd= says where the block runs
                    continue
                found.append((f"{path.relative_to(ROOT)}:{i + 1}", m.group("cwd") or ".", cmd))
    return found


def test_docs_have_dry_run_examples():
    examples = marked_examples()
    assert len(examples) >= 8, examples
    assert any(cwd != "." for _, cwd, _ in examples)


@pytest.mark.parametrize("page", ["README.md", "benchmarks/README.md"])
def test_readme_links_exist(page):
    """The README's relative links (docs/*.md, folders) point at files of the checkout, as on GitHub."""
    path = ROOT / page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{page}: broken link {target}"


def test_the_architecture_page_names_every_module_and_package():
    """`ls hpc_train hpc_train/*/ hpc_train/compute/*/ hpc_train/launch/*/ hpc_train/launch/backends/*/` matches the
    architecture page."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    root = ROOT / "hpc_train"
    folders = [root, *sorted(p for p in root.glob("*/") if (p / "__init__.py").exists())]
    folders += sorted(
        p
        for sub in ("compute", "launch", "launch/backends")
        for p in (root / sub).glob("*/")
        if (p / "__init__.py").exists()
    )
    unnamed = [
        str(path.relative_to(root))
        for folder in folders
        for path in sorted(folder.iterdir())
        if not path.name.startswith("_")
        and (path.suffix == ".py" or (path / "__init__.py").exists())
        and f"{path.name}{'/' if path.is_dir() else ''}" not in page
    ]
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"
