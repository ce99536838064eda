"""The docs: the MkDocs site builds with --strict, and the docs' runnable examples still run.

Examples are taken from the docs' own text: every ```bash block preceded by the line
``<!-- test: dry-run -->`` (or ``<!-- test: dry-run cwd=examples/user_project -->``) in README.md
or docs/**/*.md. Each of its commands runs with ``dry_run=true`` and a temporary run dir, and must
exit 0. The README's quick-start command runs the same way. Slurm's commands are kept off PATH,
so the dry runs print the sbatch script without asking a cluster (as on a laptop), whatever
state the local Slurm test cluster is in.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.paths import REPO as ROOT

BIN = Path(sys.executable).parent
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
            assert i + 1 < len(lines) and lines[i + 1].startswith("```"), f"{path}:{i + 1}: no code block after the mark"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            for cmd in commands("\n".join(lines[i + 2 : end])):
                if cmd.startswith("cd "):  # the mark's cwd= says where the block runs
                    continue
                found.append((f"{path.relative_to(ROOT)}:{i + 1}", m.group("cwd") or ".", cmd))
    return found


def quick_start() -> str:
    """The README's first command block: its last command is the main job."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).strip()
    assert block.startswith("python3 -m venv .venv && .venv/bin/pip install"), block
    return block.split("&&")[-1].strip()


def dry_run(cmd: str, cwd: str, tmp: Path) -> subprocess.CompletedProcess:
    """Run one documented hpc-train command as a dry run in a temporary run dir."""
    words = shlex.split(cmd)
    assert words[0] in ("hpc-train", ".venv/bin/hpc-train"), f"not an hpc-train command: {cmd}"
    script = []
    if "--" in words:  # hpc-train ... -- train.py ARGS: overrides go before the script's command
        cut = words.index("--")
        words, script = words[:cut], words[cut:]
    words = [str(BIN / "hpc-train"), *words[1:]]
    if "dry_run=true" not in words:
        words.append("dry_run=true")
    words.append(f"hydra.sweep.dir={tmp}/sweep" if ("-m" in words or "--multirun" in words) else f"hydra.run.dir={tmp}/run")
    env = {**os.environ, "PATH": str(BIN)}  # no sinfo/sbatch: nothing asks a Slurm cluster
    env.setdefault("IDRPROJ", "abc")  # cluster=jean_zay reads the account from it, as Jean Zay sets it at login
    env.pop("SLURM_JOB_ID", None)
    return subprocess.run(words + script, cwd=ROOT / cwd, env=env, capture_output=True, text=True, timeout=60)


def test_mkdocs_build_strict(tmp_path):
    """The whole site, config reference and API pages included, builds without one warning."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    # Generated from the YAML: a key, its default and its inline comment.
    assert "trainer.batch_size" in reference and "The global batch per optimizer step" in reference
    assert "cluster.partition" in reference and "strategy.replicate" in reference
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "hpc_train.api" in api and "staged_model" in api
    # The architecture picture is drawn offline: the page loads the site's own mermaid (Material fetches one
    # from a CDN only when the page has none), and the site carries it.
    architecture = (tmp_path / "site" / "architecture" / "index.html").read_text()
    assert 'class="mermaid"' in architecture and '<script src="../javascripts/mermaid.min.js">' in architecture
    assert (tmp_path / "site" / "javascripts" / "mermaid.min.js").stat().st_size > 1_000_000


def test_docs_have_dry_run_examples():
    examples = marked_examples()
    assert len(examples) >= 8, examples
    assert any(cwd != "." for _, cwd, _ in examples)


def test_docs_dry_run_examples(tmp_path):
    """Every marked example of the docs, and the quick start, runs as a dry run (2 at a time)."""
    jobs = [("README.md quick start", ".", quick_start())] + marked_examples()

    def one(n_job):
        n, (where, cwd, cmd) = n_job
        return where, cmd, dry_run(cmd, cwd, tmp_path / str(n))

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, enumerate(jobs)))
    failed = [f"{where}: {cmd}\n{done.stdout[-1500:]}{done.stderr[-1500:]}" for where, cmd, done in results if done.returncode]
    assert not failed, "\n\n".join(failed)
    for where, cmd, done in results:
        printed = done.stdout + done.stderr  # a run's "(dry run, ...)" line, or a sweep's "dry_run=True: <layout>" lines
        assert "dry run" in printed or "dry_run=True:" in printed, f"{where}: {cmd}: no dry-run line\n{printed}"


@pytest.mark.parametrize("page", ["README.md", "benchmarks/README.md"])
def test_readme_links_exist(page):
    """The README's relative links (docs/*.md, folders) point at files of the checkout, as on GitHub."""
    path = ROOT / page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{page}: broken link {target}"


def test_the_architecture_page_names_every_module_and_package():
    """`ls hpc_train hpc_train/*/ hpc_train/compute/*/` matches the architecture page."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    root = ROOT / "hpc_train"
    folders = [root, *sorted(p for p in root.glob("*/") if (p / "__init__.py").exists())]
    folders += sorted(p for p in (root / "compute").glob("*/") if (p / "__init__.py").exists())
    unnamed = [
        str(path.relative_to(root))
        for folder in folders
        for path in sorted(folder.iterdir())
        if not path.name.startswith("_")
        and (path.suffix == ".py" or (path / "__init__.py").exists())
        and f"{path.name}{'/' if path.is_dir() else ''}" not in page
    ]
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"
