"""The Hydra app launchers' keys (hydra-submitit-launcher's, and hpc_train's cluster, wait, pack and dry_run),
and one job's ``hydra.launcher`` node turned into submitit's sbatch parameters, a cluster profile filling what it
leaves unset."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import OmegaConf

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import APP_LOCAL, APP_SLURM
from hpc_train.config.view import ConfigView
from hpc_train.containers.settings import ContainerSettings
from hpc_train.launch.backends.slurm.params import cluster_account, cluster_qos
from hpc_train.launch.hydra import cli_child


@dataclass
class AppLocalLauncherConf:
    """The keys hydra-submitit-launcher's local launcher takes (same names, defaults and meaning), and hpc_train's
    ``wait`` (false: the jobs are started and the launch returns their ids; the adaptive sweeper follows them)."""

    _target_: str = APP_LOCAL.target
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    timeout_min: int = 60
    cpus_per_task: Optional[int] = None
    gpus_per_node: Optional[int] = None
    tasks_per_node: int = 1
    mem_gb: Optional[int] = None
    nodes: int = 1
    name: str = "${hydra.job.name}"
    stderr_to_stdout: bool = False
    wait: bool = True


@dataclass
class AppPackConf:
    """``hydra.launcher.pack.*``: the sweep's jobs as job steps of a few Slurm jobs ("allocations") instead of one
    job each; the same keys as hpc-train's ``launcher.pack.*``."""

    allocations: Optional[int] = None  # null: one Slurm job (or array task) per job
    nodes: int = 1  # nodes of each allocation
    gpus_per_node: Optional[int] = None  # null: the cluster profile's (hydra.launcher.cluster) gpus_per_node
    time: Any = None  # minutes or a Slurm duration; null: hydra.launcher.timeout_min


@dataclass
class AppContainerConf:
    """``hydra.launcher.container.*``: the image the app's tasks run in; the same keys as hpc-train's
    ``container.*`` (null name: the cluster profile's container, else none)."""

    name: Optional[str] = None
    image: Optional[str] = None
    mounts: List[str] = field(default_factory=list)
    env: Dict[str, Any] = field(default_factory=dict)
    options: List[str] = field(default_factory=list)
    command: Optional[str] = None
    hpc_train: str = "mount"


@dataclass
class AppLauncherConf(AppLocalLauncherConf):
    """hydra-submitit-launcher's Slurm keys, and hpc_train's ``cluster``, ``wait``, ``pack`` and ``dry_run``."""

    _target_: str = APP_SLURM.target
    partition: Optional[str] = None
    qos: Optional[str] = None
    comment: Optional[str] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    gres: Optional[str] = None
    cpus_per_gpu: Optional[int] = None
    gpus_per_task: Optional[int] = None
    mem_per_gpu: Optional[str] = None
    mem_per_cpu: Optional[str] = None
    account: Optional[str] = None
    signal_delay_s: int = 120
    max_num_timeout: int = 0
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    array_parallelism: int = 256
    setup: Optional[List[str]] = None
    srun_args: Optional[List[str]] = None
    cluster: Optional[str] = None
    pack: AppPackConf = field(default_factory=AppPackConf)
    container: AppContainerConf = field(default_factory=AppContainerConf)
    dry_run: bool = False


# launcher key -> submitit SlurmExecutor parameter (the rest keep their names)
SLURM_NAMES = {"timeout_min": "time", "tasks_per_node": "ntasks_per_node", "name": "job_name"}
# Each app launcher's keys, by its name in hydra/launcher (hydra_plugins.hpc_train_launcher registers them).
APP_CONFS = {APP_SLURM.name: AppLauncherConf, APP_LOCAL.name: AppLocalLauncherConf}
_NOT_SBATCH = {"_target_", "submitit_folder", "max_num_timeout", "wait", "cluster", "pack", "dry_run", "container"}
LOCAL_KEYS = ("timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "nodes", "mem_gb")


def cluster_profile(name: str) -> Dict[str, Any]:
    """The cluster section of the profile `name` (see ``profile``)."""
    return composed_profile(name)[0]


@functools.lru_cache(maxsize=None)
def composed_profile(name: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """hpc_train's cluster profile `name` (shipped, e.g. jean_zay), or a profile file of the user's
    (``path/to/my_conf/cluster/mysite.yaml``), composed by hpc-train's own config in this process (Hydra's compose
    API, the app's own Hydra state set aside and restored): its defaults list and interpolations work as they do
    for hpc-train's own jobs."""
    path = Path(name).expanduser()
    if path.suffix in (".yaml", ".yml"):  # my_conf/cluster/mysite.yaml: the config dir is two levels up
        overrides, config_dir = [f"cluster={path.stem}"], str(path.resolve().parent.parent)
    else:
        overrides, config_dir = [f"cluster={name}"], None
    try:
        cfg, _ = cli_child.compose(overrides, config_dir)
    except ConfigError as err:
        raise ConfigError(
            "hydra.launcher.cluster",
            f"hpc_train could not compose the cluster profile {name!r}: {err.problem}",
            "name a shipped profile (jean_zay, slurm, ...) or the path of your own cluster/<name>.yaml.",
        ) from None
    if cfg.cluster.get("login"):  # the app's own command line is not hpc-train's: nothing to forward it with
        raise ConfigError(
            "hydra.launcher.cluster",
            f"the cluster profile {name!r} sets cluster.login ({cfg.cluster.login}): a Hydra app of your own is"
            " submitted from the cluster's login node, not over SSH from this machine.",
            "run the app on the login node (ssh there; your project and its Python as for any job), or submit your"
            " script from here with hpc-train, which works over SSH: hpc-train cluster=... -- your_app.py ARGS.",
        )
    container = OmegaConf.to_container(cfg.container, resolve=True) if "container" in cfg else {}
    return dict(OmegaConf.to_container(cfg.cluster, resolve=True)), dict(container or {})


def apply_profile(launcher: Dict[str, Any]) -> Dict[str, Any]:
    """The launcher keys with what ``cluster`` supplies filled in where they are unset: partition, account (also
    from ``account_env``), QoS (also by time), constraint, memory, setup lines, CPUs (``cpus_per_gpu`` x GPUs per
    task), ``--hint`` and the profile's extra sbatch options."""
    if not launcher.get("cluster"):
        return launcher
    profile = ConfigView(cluster_profile(str(launcher["cluster"])))
    out = dict(launcher)

    def fill(key: str, value: Any) -> None:
        if out.get(key) in (None, [], {}) and value not in (None, [], {}):
            out[key] = value

    fill("partition", profile.get("partition"))
    fill("account", cluster_account(profile))
    fill("qos", cluster_qos(profile, int(out.get("timeout_min") or 60)))
    fill("constraint", profile.get("constraint"))
    fill("mem_gb", profile.get("mem_gb"))
    fill("setup", list(profile.get("setup") or []))
    gpus, tasks = out.get("gpus_per_node"), int(out.get("tasks_per_node") or 1)
    if out.get("cpus_per_task") is None and out.get("cpus_per_gpu") is None and gpus and profile.get("cpus_per_gpu"):
        out["cpus_per_task"] = max(1, int(profile.cpus_per_gpu) * int(gpus) // tasks)
    extra = {**dict(profile.get("extra") or {}), **dict(out.get("additional_parameters") or {})}
    if profile.get("hint"):
        extra.setdefault("hint", str(profile.hint))
    out["additional_parameters"] = extra
    own = dict(out.get("container") or {})
    if own.get("name") is None:  # the app did not pick a runtime: the profile's, with the app's keys over it
        site = composed_profile(str(launcher["cluster"]))[1]
        out["container"] = {**site, **{k: v for k, v in own.items() if v not in (None, [], {})}}
    return out


def container_section(launcher: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The app's container keys as hpc-train's ``container`` section (None: no container)."""
    section = dict(launcher.get("container") or {})
    if not ContainerSettings.from_section(section).enabled:
        return None
    return {**section, "mounts": list(section.get("mounts") or []), "env": dict(section.get("env") or {})}


def slurm_parameters(launcher: Dict[str, Any]) -> Dict[str, Any]:
    """submitit SlurmExecutor parameters for one job's ``hydra.launcher`` node (unset keys left to Slurm)."""
    params: Dict[str, Any] = {}
    for key, value in launcher.items():
        if key in _NOT_SBATCH or value is None or value == {} or value == []:
            continue
        if key == "mem_gb":
            params["mem"] = f"{int(value)}GB"
        else:
            params[SLURM_NAMES.get(key, key)] = value
    return params
