"""``hpc-train`` on a laptop with ``cluster.login``: composed, validated and laid out here, then the project synced
and the same command run by the cluster's own hpc_train, which submits exactly what its login node would.

What crosses is data: the command line's overrides (paths said the cluster's way, hpc_train.remote.paths), never a
pickle of this Python's objects. A job run by ``launcher=local`` stays on this machine. A dry run stays here too:
checks that need the cluster (capacity) go over the connection when one is open, else are skipped with a note.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig

from hpc_train.config.launcher import launcher_kind
from hpc_train.hosts import hosts
from hpc_train.hosts.ssh import SshTarget
from hpc_train.launch.planning.errors import Forwarded
from hpc_train.remote import paths, sync
from hpc_train.remote.connection import Connection
from hpc_train.remote.forward import Dropped, forward
from hpc_train.remote.settings import RemoteSettings

CLI_MODULE = "hpc_train.cli"
_DIR_KEYS = ("hydra.run.dir=", "hydra.sweep.dir=")


def wanted(cfg: Any) -> bool:
    """Whether this job is the cluster's to submit: ``cluster.login`` set and a launcher that does not run here."""
    return bool(cfg.cluster.get("login")) and not launcher_kind(cfg.launcher.name).on_this_machine


def settings_of(cfg: Any, hydra_cfg: Any) -> RemoteSettings:
    """The cluster of this command, with the hpc-train-connect words that name it as the command did."""
    return replace(RemoteSettings.of(cfg), connect_words=tuple(connect_words(hydra_cfg)))


def connect_words(hydra_cfg: Any) -> List[str]:
    """What hpc-train-connect needs to reach the cluster this command names: its ``--config-dir``, its cluster
    option (the launcher's default included) and its ``cluster.*`` overrides (``cluster.login=`` among them)."""
    if hydra_cfg is None:
        return []
    config_dir = _config_dir(hydra_cfg)
    words = ["--config-dir", str(config_dir)] if config_dir is not None else []
    own = [o for o in hydra_cfg.overrides.task if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "cluster"]
    if not any(o.lstrip("+~").startswith("cluster=") for o in own):
        choice = hydra_cfg.runtime.choices.get("cluster")
        words += [f"cluster={choice}"] if choice else []
    return words + [str(o) for o in own]


def dry_run_commands(cfg: Any, hydra_cfg: Any = None) -> None:
    """A dry run's checks that ask Slurm go to the cluster when a connection is open; else they are skipped, said."""
    settings = settings_of(cfg, hydra_cfg if hydra_cfg is not None else _current_hydra())
    if SshTarget(str(settings.login)).master_alive():
        hosts.use(Connection(settings).host)
        return
    print(
        f"hpc-train (dry run): no connection to {settings.login} is open, so the checks that ask the cluster"
        f" (partitions, capacity) were skipped; {settings.connect_command()} opens one.",
        file=sys.stderr,
    )
    hosts.use(hosts.Unconnected(str(settings.login)))


def run_on_cluster(cfg: Any, local_dir: Path, hydra_cfg: Any, multirun: bool, also: Sequence[str] = ()) -> None:
    """Sync, then run this command on the cluster (`also`: overrides that replace the command's own of those keys);
    raises Forwarded with its exit status (always)."""
    settings = settings_of(cfg, hydra_cfg)
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
    replaced = (*_DIR_KEYS, *(o.split("=", 1)[0] + "=" for o in also))
    own = [o for o in hydra_cfg.overrides.hydra if not o.startswith(replaced)]
    args += paths.translate([*task, *own], root, cluster.project, conn)
    local_dir = local_dir if local_dir.is_absolute() else root / local_dir
    remote = paths.remote_of(str(local_dir), root, cluster.project)
    args += ["cluster.login=null", f"hydra.{'sweep' if multirun else 'run'}.dir={remote}", *also]
    try:
        outcome = forward(conn, CLI_MODULE, args, local_dir, remote)
    except Dropped as dropped:
        print(dropped, file=sys.stderr)
        raise Forwarded(1) from None
    if outcome.code == 0:  # else the cluster's last line says what happened
        print(f"hpc-train: on {settings.login}: {remote}; its records here: {local_dir} (hpc-train-report {local_dir})")
    raise Forwarded(outcome.code, outcome.refusal)


def _current_hydra() -> Any:
    """Hydra's config of the running command (None outside one)."""
    return HydraConfig.get() if HydraConfig.initialized() else None


def _config_dir(hydra_cfg: Any) -> Optional[Path]:
    """The user's ``--config-dir`` (Hydra's command-line config source), if any."""
    for source in hydra_cfg.runtime.config_sources:
        if source.provider == "command-line" and source.schema == "file":
            return Path(source.path)
    return None
