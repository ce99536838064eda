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
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.paths import REPO as ROOT
from tests.unit.test_docs_text import commands, marked_examples

BIN = Path(sys.executable).parent


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
    words.append(
        f"hydra.sweep.dir={tmp}/sweep" if ("-m" in words or "--multirun" in words) else f"hydra.run.dir={tmp}/run"
    )
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


def test_docs_dry_run_examples(tmp_path):
    """Every marked example of the docs, and the quick start, runs as a dry run (2 at a time)."""
    jobs = [("README.md quick start", ".", quick_start())] + marked_examples()

    def one(n_job):
        n, (where, cwd, cmd) = n_job
        return where, cmd, dry_run(cmd, cwd, tmp_path / str(n))

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, enumerate(jobs)))
    failed = [
        f"{where}: {cmd}\n{done.stdout[-1500:]}{done.stderr[-1500:]}" for where, cmd, done in results if done.returncode
    ]
    assert not failed, "\n\n".join(failed)
    for where, cmd, done in results:
        printed = (
            done.stdout + done.stderr
        )  # a run's "(dry run, ...)" line, or a sweep's "dry_run=True: <layout>" lines
        assert "dry run" in printed or "dry_run=True:" in printed, f"{where}: {cmd}: no dry-run line\n{printed}"


def readme_as_a_user_runs_it(tmp: Path) -> str:
    """The README's shell commands, every bash block in the order written, as one script for a clean shell: the
    install is left out (the suite's own ``.venv`` is the one it makes), each ``hpc-train`` command runs as a dry
    run in a temporary run dir, ``cd`` and ``source`` run as written, and any other command (a report of a run dir
    the README made up, the test suite itself) must at least be found, as written, on the shell's PATH."""
    lines = ["set -u"]
    for n, block in enumerate(re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)):
        for cmd in commands(block):
            for part in " ".join(shlex.split(cmd)).split(" && "):
                words = shlex.split(part)
                if words[:3] == ["python3", "-m", "venv"] or words[0].endswith("/pip"):
                    continue  # the install
                if words[0] in ("cd", "source", "."):
                    shown = shlex.join(words)
                elif words[0] in ("hpc-train", ".venv/bin/hpc-train"):
                    cut = words.index("--") if "--" in words else len(words)
                    where = "sweep" if "-m" in words[:cut] else "run"
                    extra = [f"hydra.{where}.dir={tmp}/{where}{n}-{len(lines)}"]
                    extra += [] if "dry_run=true" in words else ["dry_run=true"]
                    shown = shlex.join(words[:cut] + extra + words[cut:])
                else:
                    shown = f"command -v {shlex.quote(words[0])} >/dev/null"
                lines.append(f"{shown} || {{ echo {shlex.quote('README command failed: ' + part)} >&2; exit 1; }}")
    return "\n".join(lines) + "\n"


def test_readme_commands_run_as_written_in_a_new_shell(tmp_path):
    """A new shell (no virtual environment on PATH, no Slurm configuration), the README's commands typed in order
    from the checkout: each runs (an hpc-train command as its dry run), after the README's own instructions."""
    clean_path = "/usr/local/bin:/usr/bin:/bin"
    assert shutil.which("hpc-train", path=clean_path) is None  # only the README's own instructions provide it
    assert (ROOT / ".venv" / "bin" / "activate").exists(), "the README installs into ./.venv"
    env = {"PATH": clean_path, "HOME": str(tmp_path), "LANG": "C.UTF-8", "SLURM_CONF": "/nonexistent/slurm.conf"}
    env |= {"IDRPROJ": "abc", "CUDA_VISIBLE_DEVICES": ""}  # cluster=jean_zay reads its account from IDRPROJ
    script = readme_as_a_user_runs_it(tmp_path)
    done = subprocess.run(
        ["/bin/bash", "--noprofile", "--norc", "-c", script],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- the script:\n{script}"
    assert done.stdout.count("hpc-train (dry run") >= 8, done.stdout[-3000:]
