"""hpc_train's errors are one tree (hpc_train.errors): no module raises a bare Exception or RuntimeError, every
exception class of the package is an HpcTrainError but for the few that steer control inside it, and the `hpc-train`
command ends on each family with its exit code and its one message (hpc_train.launch.hydra.exits), called in this
process. A cluster that cannot be reached and a failed job need processes (ssh, ranks):
tests/e2e/test_error_exit_codes.py."""

import ast
import builtins
import errno
import os
from pathlib import Path
from typing import Dict, List, Set

import pytest

from hpc_train import errors
from hpc_train.hosts import ssh
from hpc_train.launch.hydra import exits
from hpc_train.records import run_claim, rundir
from hpc_train.remote import forward
from tests.support.cli import TINY, run_cli_in_process
from tests.support.paths import SRC

BARE = {"Exception", "RuntimeError", "BaseException"}
# Exception classes that are no HpcTrainError on purpose, with their subclasses: each steers control inside hpc_train
# and is caught there (or is Ctrl-C), so no caller of the API or the command sees it as an error of hpc_train's.
NOT_IN_THE_TREE = {
    "Interrupted": "Ctrl-C said in one line: a KeyboardInterrupt, so Hydra, a notebook and the API let it through",
    "Refused": "a BaseException carrying an HpcTrainError out of Hydra's callbacks to hpc_train.cli",
    "Forwarded": "the exit code of a command the cluster ran, caught by hpc_train.cli",
    "TrainingInterrupted": "a stop signal at a step boundary, caught by the rank's entry point (exit code 3)",
    "StepNotCommitted": "a replica step the quorum did not agree on, caught by the step loop and taken again",
    "InjectedFailure": "HPC_TRAIN_FAIL_AT's stand-in for a bug: a RuntimeError as a bug would raise",
    "ForkServerLost": "the tests' fork server gone, caught by the local launcher (a fresh process instead)",
}


def _modules(root: Path) -> Dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted((root / "hpc_train").rglob("*.py"))}


def _name(node: ast.expr) -> str:
    """The class a `raise` or a base names: `X`, `X(...)`, `module.X` -> X."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def bare_raises(root: Path) -> List[str]:
    """`raise Exception(...)`, `raise RuntimeError(...)` (or BaseException) in the package under `root`."""
    return [
        f"{path.relative_to(root)}:{node.lineno}"
        for path, tree in _modules(root).items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise) and node.exc is not None and _name(node.exc) in BARE
    ]


def outside_the_tree(root: Path) -> List[str]:
    """The exception classes of the package under `root` with no HpcTrainError among their ancestors (read by name:
    a base spelled `errors.DiskFull` is DiskFull), less NOT_IN_THE_TREE and their subclasses."""
    bases: Dict[str, Set[str]] = {}
    where: Dict[str, str] = {}
    for path, tree in _modules(root).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(_name(base) for base in node.bases)
                where.setdefault(node.name, f"{path.relative_to(root)}:{node.lineno}")

    def ancestors(name: str, seen: Set[str]) -> Set[str]:
        found = set()
        for base in bases.get(name, set()) - seen:
            found |= {base} | ancestors(base, seen | {name, base})
        return found

    def is_exception(name: str) -> bool:
        return isinstance(getattr(builtins, name, None), type) and issubclass(getattr(builtins, name), BaseException)

    return sorted(
        f"{where[name]} {name}"
        for name in bases
        if any(is_exception(a) for a in ancestors(name, set()))
        and "HpcTrainError" not in ancestors(name, set())
        and name != "HpcTrainError"
        and not ({name} | ancestors(name, set())) & set(NOT_IN_THE_TREE)
    )


def test_no_module_raises_a_bare_exception_or_runtime_error():
    """A caller catches hpc_train's errors by family; a bare Exception or RuntimeError belongs to none."""
    assert not bare_raises(SRC), f"raise a family of hpc_train.errors instead: {bare_raises(SRC)}"


def test_every_exception_class_is_an_hpc_train_error():
    """`except hpc_train.HpcTrainError` catches anything hpc_train refuses or cannot do."""
    assert not outside_the_tree(SRC), f"not under hpc_train.errors.HpcTrainError: {outside_the_tree(SRC)}"


@pytest.mark.parametrize(
    "error, code",
    [
        (errors.ConfigError("trainer.lr", "it is negative.", "trainer.lr=0.1."), rundir.EXIT_REFUSED),
        (errors.Unreachable("cluster.login", "me@x cannot be reached.", "check your VPN."), rundir.EXIT_UNREACHABLE),
        (run_claim.RunDirBusy(Path("/r"), run_claim.Claim("t", "n", 1, None, 0.0, 0.0), "alive"), rundir.EXIT_REFUSED),
        (rundir.RecordNotWritten("no space left to write summary.json in /r: nothing."), rundir.EXIT_REFUSED),
        (errors.JobFailed("the job failed", exit_code=rundir.EXIT_HUNG), rundir.EXIT_HUNG),
        (ssh.SshError("me@x", "unreachable", "Connection refused"), rundir.EXIT_UNREACHABLE),
        (forward.Dropped("the connection to me@x dropped while the cluster's hpc-train ran"), rundir.EXIT_FAILED),
    ],
    ids=["config", "unreachable", "run_dir", "disk_full", "job_failed", "ssh_failed", "dropped_while_forwarded"],
)
def test_each_family_has_its_exit_code_and_comes_back_as_itself(error, code):
    """The table holds every family; a refusal written as data is read back as the same family (the API's side)."""
    assert exits.exit_code(error) == code
    assert {family.kind for family in exits.FAMILIES} == {
        errors.ConfigError,
        errors.Unreachable,
        errors.JobFailed,
        errors.RunDirRefused,
        errors.DiskFull,
    }
    if isinstance(error, exits.REFUSALS):
        back = exits.from_data(exits.as_data(error))
        assert exits.family_of(back) == exits.family_of(error) and exits.one_message(back) == exits.one_message(error)


# -- through the command, in this process -------------------------------------------------------------------------
def test_a_refused_configuration_exits_2_with_its_one_message(tmp_path):
    proc = run_cli_in_process([*TINY, "trainer.epochs=0"], tmp_path / "run", refused=True)
    assert proc.returncode == rundir.EXIT_REFUSED, proc.stderr
    assert proc.stderr.startswith("hpc-train: invalid configuration for `trainer.epochs`:") and "Traceback" not in (
        proc.stdout + proc.stderr
    )


def test_a_run_dir_a_live_job_holds_exits_2_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_claim.acquire(run_dir, "another-launch")  # held by this process, alive
    proc = run_cli_in_process(TINY, run_dir, refused=True)
    assert proc.returncode == rundir.EXIT_REFUSED, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"hpc-train: run dir {run_dir} is in use by"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_full_disk_under_the_run_dirs_claim_exits_2_naming_the_file(tmp_path, monkeypatch):
    """The claim is the first record a launch writes: no space to create it (ENOSPC from the file system)."""
    real_open = os.open

    def full_disk(path, *args, **kwargs):
        if Path(path).name.startswith(f".{run_claim.CLAIM}.tmp"):  # rundir.temporary_name's
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)
    proc = run_cli_in_process(TINY, tmp_path / "run", refused=True)
    assert proc.returncode == rundir.EXIT_REFUSED, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"hpc-train: no space left to write {run_claim.CLAIM}"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
