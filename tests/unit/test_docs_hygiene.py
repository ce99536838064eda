"""Docs and code speak of the product: no references to this project's issues, no paths of a developer's machine.

Where it looks: README.md and every file under docs/, hpc_train/, hydra_plugins/, conf/,
benchmarks/, scripts/, examples/, notebooks/ and sbatch/ with a text suffix (.md .py .yaml .yml .sh
.slurm .txt .toml .ipynb), leaving out the folders .gitignore names (.venv/, outputs/, build/, ...:
what runs and builds leave behind). Not checked: benchmarks/results/ (measurement records: they
keep what the measuring machine reported) and docs/javascripts/ (vendored third-party code).

What fails, each named as file:line:

* **An issue reference**: the word issue(s), bug, ticket or pull request, or PR, followed by a number
  (``issue 12``, ``Issue #12``, ``PR 7``); or a bare ``#12`` (1-5 digits) that reads as a reference.
  A bare ``#N`` is not a reference when it is another project's (``owner/repo#12``,
  ``pytest-xdist#1386``: a name right before the ``#``), part of a URL or HTML entity, a hex colour
  (``#4C72B0``), a count of something (``job #0``, ``rank #3``, ``task``, ``step``, ``run``, ``item``,
  ``attempt``, ``array``, ``node`` before it), or inside a fenced code block of a Markdown page
  (printed output, where the report numbers jobs ``#7``). Another project's issue is cited by its
  URL (``https://github.com/facebookresearch/hydra/issues/2145``), which never matches: the number
  follows ``issues/``, not the word and a space or ``#``.
* **An absolute path of a developer's machine**: ``/home/<name>``, ``/Users/<name>``, ``/root/``,
  ``/work/`` (not part of a longer path or variable: ``$SCRATCH/work/`` and ``~/venv`` pass).
  System paths a cluster really has (``/etc/slurm``, ``/tmp``, ``/dev/shm``, ``/proc``,
  ``/usr/bin``) are fine; so is a shortened path (``.../outputs/...``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from tests.support import gitignore
from tests.support.paths import REPO as ROOT

PLACES = (
    "README.md",
    "docs",
    "hpc_train",
    "hydra_plugins",
    "conf",
    "benchmarks",
    "scripts",
    "examples",
    "notebooks",
    "sbatch",
)
SKIPPED = ("benchmarks/results/", "docs/javascripts/")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".slurm", ".txt", ".toml", ".ipynb"}

ISSUE_WORD = re.compile(r"(?i)\b(?:issues?|bugs?|tickets?|pull requests?)\s*#?\s*\d+\b|\bPRs?\s*#?\s*\d+\b")
COUNTED = r"(?:job|jobs|rank|ranks|task|tasks|step|steps|run|runs|item|items|attempt|attempts|array|arrays|node|nodes)"
BARE_HASH = re.compile(r"(?<![\w/#&.\-])#\d{1,5}(?![\w-])")
COUNT_BEFORE = re.compile(rf"(?i)\b{COUNTED}\s*$")
MACHINE_PATH = re.compile(r"(?<![\w.~$}\-/])/(?:(?:home|Users)/[A-Za-z_][\w.-]*|root/|work/)")


def checked_files() -> List[Path]:
    """Every text file of the checked places, outside ignored and skipped folders."""
    found = []
    for place in PLACES:
        top = ROOT / place
        if top.is_file():
            found.append(top)
            continue
        for folder, subfolders, names in os.walk(top):  # links are not followed: hpc_train/conf is conf/
            subfolders[:] = sorted(d for d in subfolders if not gitignore.ignored(Path(folder) / d))
            found += [Path(folder) / name for name in sorted(names) if Path(name).suffix in SUFFIXES]
    return [path for path in found if not path.relative_to(ROOT).as_posix().startswith(SKIPPED)]


def lines_outside_fences(path: Path, text: str) -> Iterator[Tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block of a Markdown page)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if path.suffix == ".md" and line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def problems(path: Path, root: Path = ROOT) -> List[str]:
    """Every breach of the rule in one file, as 'file:line: what: the text'."""
    where = path.relative_to(root)
    text = path.read_text(encoding="utf-8", errors="replace")
    found = []
    for number, line, fenced in lines_outside_fences(path, text):
        worded = list(ISSUE_WORD.finditer(line))
        hits = [("issue reference", m.group(0)) for m in worded]
        if not fenced:
            hits += [
                ("issue reference", m.group(0))
                for m in BARE_HASH.finditer(line)
                if not COUNT_BEFORE.search(line[: m.start()])
                and not any(w.start() <= m.start() < w.end() for w in worded)
            ]
        hits += [("machine path", m.group(0)) for m in MACHINE_PATH.finditer(line)]
        found += [f"{where}:{number}: {what} {hit!r}: {line.strip()[:160]}" for what, hit in hits]
    return found


def test_no_issue_numbers_or_machine_paths_in_docs_and_code():
    files = checked_files()
    assert any(f.name == "benchmarks.md" for f in files) and any(f.suffix == ".py" for f in files), "nothing to check?"
    found = [problem for path in files for problem in problems(path)]
    assert not found, "docs and code speak of the product, not of its issues or a developer's machine:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "line, flagged",
    [
        ("the fix of issue #24, section 4", True),
        ("Issue 31 reported a finished run", True),
        ("see #12 for the details", True),
        ("(PR 7)", True),
        ("print(run_dir)  # /home/alice/outputs/x", True),
        ("cd /work/main && pytest", True),
        ("HOME=/root/ python x.py", True),
        ("pytest-xdist 3.8 (pytest-xdist#1386)", False),
        ("https://github.com/facebookresearch/hydra/issues/2145", False),
        ('palette = ["#4C72B0", "#DD8452"]', False),
        ("this line's prefix would change after job #0", False),
        ("SLURM_CONF=/etc/slurm/slurm.conf and /tmp/r2/logs", False),
        ("RUN_DIR=$SCRATCH/work/exp1 PYTHON=~/venv/bin/python", False),
        ("# 4242 .../outputs/2026-11-23/10-00-00 PENDING", False),
        ("the issue's bar", False),
    ],
)
def test_the_rule(tmp_path, line, flagged):
    """The rule itself, on lines that must and must not fail."""
    page = tmp_path / "page.py"
    page.write_text(line + "\n")
    assert bool(problems(page, tmp_path)) is flagged, problems(page, tmp_path)


def test_fenced_output_may_number_jobs(tmp_path):
    """A Markdown page's fenced output may number jobs (`#7`); its prose may not cite `#7`."""
    page = tmp_path / "page.md"
    page.write_text("```\n  #7 412_7 FAILED: InjectedFailure\n```\nbut not here: #7\n")
    assert [p.split(":")[1] for p in problems(page, tmp_path)] == ["4"]
