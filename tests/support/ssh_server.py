"""The real OpenSSH server in front of the Slurm test cluster (scripts/ssh_test_server.sh), and the "laptop" user's
side of it: start the server, run commands as the laptop with a clean environment, make its working folders.

The laptop is the Unix user hpclaptop; the cluster's login side is hpccluster (each home 0700). The Slurm test
cluster itself is started by conftest's `slurm_cluster` fixture, not here: use that fixture first.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from tests.support.paths import REPO

SSH_SCRIPT = REPO / "scripts" / "ssh_test_server.sh"
LAPTOP_USER = "hpclaptop"
CLUSTER_USER = "hpccluster"
LAPTOP_HOME = Path("/home") / LAPTOP_USER
# all a laptop command sees of the environment (plus its env_extra): nothing of root's session, and a SLURM_CONF
# that names no file, so a Slurm command that ran on the laptop instead of the cluster fails at once (this machine's
# /etc/slurm/slurm.conf is the test cluster's: without it a leak would go unseen)
LAPTOP_ENV = {
    "SLURM_CONF": "/nonexistent/laptop-has-no-slurm.conf",
    "HOME": str(LAPTOP_HOME),
    "USER": LAPTOP_USER,
    "LOGNAME": LAPTOP_USER,
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
}

Args = Sequence[Union[str, Path]]


def start_ssh_server() -> Dict[str, str]:
    """`ssh_test_server.sh start` (a second start finds it up: about a second), then its `env` as a dict:
    HPC_TRAIN_SSH_DIR, _PORT, _ALIAS, _LAPTOP_USER, _CLUSTER_USER, _LAPTOP_PYTHON, _CLUSTER_PYTHON, _OLD_PYTHON.

    Raises RuntimeError with the script's output when the server does not start.
    """
    proc = subprocess.run(["bash", str(SSH_SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the SSH test server did not start:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    env = subprocess.run(["bash", str(SSH_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    return {key: value.strip("'\"") for key, value in re.findall(r"^export (\w+)=(\S+)$", env, flags=re.M)}


def _laptop_command(args: Args, env_extra: Optional[Dict[str, str]]) -> List[str]:
    env = {**LAPTOP_ENV, **(env_extra or {})}
    return ["runuser", "-u", LAPTOP_USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *map(str, args)]


def as_laptop(
    args: Args,
    cwd: Optional[Path] = None,
    env_extra: Optional[Dict[str, str]] = None,
    timeout: float = 300,
    input: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """Run ARGS as the laptop user in a clean environment (LAPTOP_ENV plus env_extra), in cwd (default: the
    laptop's home, never the checkout), input (text) or no stdin; returns the finished process, stdout and stderr
    apart, as text."""
    return subprocess.run(
        _laptop_command(args, env_extra),
        cwd=cwd or LAPTOP_HOME,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,  # ssh must not read the test runner's stdin
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def as_laptop_popen(
    args: Args, cwd: Optional[Path] = None, env_extra: Optional[Dict[str, str]] = None
) -> subprocess.Popen:
    """as_laptop, started and not waited for: in a new session (os.killpg(proc.pid, SIGINT) is a Ctrl-C to it and
    its children; runuser waits for the command and exits with its status), stdin closed, stderr merged into
    stdout (text): `out, _ = proc.communicate(timeout=...)`."""
    return subprocess.Popen(
        _laptop_command(args, env_extra),
        cwd=cwd or LAPTOP_HOME,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def laptop_dir(name: str) -> Path:
    """A fresh, empty folder /home/hpclaptop/NAME owned by the laptop user, mode 0700 (one made before under that
    name is removed). NAME is one plain name; the laptop's own files (.ssh, venv) cannot be named."""
    if not name or "/" in name or name.startswith(".") or name == "venv":
        raise ValueError(f"laptop_dir: {name!r} is not a plain folder name of the laptop's home")
    user = pwd.getpwnam(LAPTOP_USER)
    path = Path(user.pw_dir) / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o700)
    return path


def cluster_home() -> Path:
    """The cluster user's home (/home/hpccluster): where its venvs live and the laptop's runs land."""
    return Path(pwd.getpwnam(CLUSTER_USER).pw_dir)
