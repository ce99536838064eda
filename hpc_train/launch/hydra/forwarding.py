"""``hpc-train`` on a laptop with ``cluster.login``: composed, validated and laid out here, then the project synced
and the same command run by the cluster's own hpc_train, which submits exactly what its login node would.

What crosses is data: the command line's overrides (paths said the cluster's way, hpc_train.remote.paths), never a
pickle of this Python's objects. A job run by ``launcher=local`` stays on this machine. A dry run stays here too:
checks that need the cluster (capacity) go over the connection when one is open, else are skipped with a note.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional

from hpc_train.config.launcher import launcher_kind
from hpc_train.hosts import hosts
from hpc_train.hosts.ssh import SshTarget
from hpc_train.launch.planning.errors import Forwarded
from hpc_train.remote import paths, sync
from hpc_train.remote.connection import CONNECT_COMMAND, Connection
from hpc_train.remote.forward import Dropped, forward
from hpc_train.remote.settings import RemoteSettings

CLI_MODULE = "hpc_train.cli"
_DIR_KEYS = ("hydra.run.dir=", "hydra.sweep.dir=")


def wanted(cfg: Any) -> bool:
    """Whether this job is the cluster's to submit: ``cluster.login`` set and a launcher that does not run here."""
    return bool(cfg.cluster.get("login")) and not launcher_kind(cfg.launcher.name).on_this_machine


def dry_run_commands(cfg: Any) -> None:
    """A dry run's checks that ask Slurm go to the cluster when a connection is open; else they are skipped, said."""
    settings = RemoteSettings.of(cfg)
    if SshTarget(str(settings.login)).master_alive():
        hosts.use(Connection(settings).host())
        return
    print(
        f"hpc-train (dry run): no connection to {settings.login} is open, so the checks that ask the cluster"
        f" (partitions, capacity) were skipped; {CONNECT_COMMAND} cluster={settings.profile} opens one.",
        file=sys.stderr,
    )
    hosts.use(hosts.Unconnected(str(settings.login)))


def run_on_cluster(cfg: Any, local_dir: Path, hydra_cfg: Any, multirun: bool) -> None:
    """Sync, then run this command on the cluster; raises Forwarded with its exit status (always)."""
    settings = RemoteSettings.of(cfg)
    root = Path(str(hydra_cfg.runtime.cwd))
    conn = Connection(settings)
    cluster = conn.open(settings.project_dir(root))
    files = sync.project_files(root)
    sync.check_size(root, files, settings.sync_limit_mb)
    synced = sync.push(conn, cluster, root, files, cluster.project)
    print(
        f"hpc-train: synced {root} to {settings.login}:{cluster.project} ({synced.sent} of {synced.files} files"
        f" changed, {sync.size_words(synced.total_bytes)} in all, by {synced.how})",
        flush=True,
    )
    args: List[str] = []
    config_dir = _config_dir(hydra_cfg)
    if config_dir is not None:
        remote_cd = paths.remote_of(str(config_dir), root, cluster.project)
        if remote_cd == str(config_dir):  # outside the project: synced beside it
            remote_cd = f"{cluster.project}/.hpc_train/config-dirs/{config_dir.name}"
            sync.push(conn, cluster, config_dir, sync.project_files(config_dir), remote_cd)
        args += ["--config-dir", remote_cd]
    if multirun:
        args.append("-m")
    task = [o for o in hydra_cfg.overrides.task if not o.lstrip("+~").startswith("cluster.login=")]
    own = [o for o in hydra_cfg.overrides.hydra if not o.startswith(_DIR_KEYS)]
    args += paths.translate([*task, *own], root, cluster.project, conn)
    local_dir = local_dir if local_dir.is_absolute() else root / local_dir
    remote = paths.remote_of(str(local_dir), root, cluster.project)
    args += ["cluster.login=null", f"hydra.{'sweep' if multirun else 'run'}.dir={remote}"]
    try:
        outcome = forward(conn, CLI_MODULE, args, local_dir, remote)
    except Dropped as dropped:
        print(dropped, file=sys.stderr)
        raise Forwarded(1) from None
    if outcome.code == 0:  # else the cluster's last line says what happened
        print(f"hpc-train: on {settings.login}: {remote}; its records here: {local_dir} (hpc-train-report {local_dir})")
    raise Forwarded(outcome.code, outcome.refusal)


def _config_dir(hydra_cfg: Any) -> Optional[Path]:
    """The user's ``--config-dir`` (Hydra's command-line config source), if any."""
    for source in hydra_cfg.runtime.config_sources:
        if source.provider == "command-line" and source.schema == "file":
            return Path(source.path)
    return None
