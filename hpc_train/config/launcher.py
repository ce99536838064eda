"""The launcher group: where a job runs (local, slurm, sbatch), the requeue signal and sweep throttle."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Tuple

from hpc_train.config.checks import INT64_MAX, Problem, flag, one_of, show, slurm_time, whole
from hpc_train.config.errors import ConfigError
from hpc_train.config.rule import R, Rule


@dataclass(frozen=True)
class LauncherKind:
    """What a launcher is, as the plan, the job spec and the API read it (how it runs jobs is its backend's:
    hpc_train.launch.backends.registry). Nothing compares a launcher's name: it reads these fields."""

    name: str
    on_this_machine: bool  # the ranks start on the machine the command runs on: one node, whose GPUs are counted here
    submits: bool  # the command queues a Slurm job (a job id, the queue, accounting) instead of running the ranks
    slurm_job: bool  # the ranks run inside a Slurm job: a time limit, its signal, compute nodes without internet
    prepares_only: bool  # the command only checks its allocation and writes the job spec (a plain sbatch script's step)

    def rank_settings(self) -> Dict[str, Any]:
        """The job spec's ``backend`` section: what a rank needs to know of how it was started (never the name to
        branch on: the spec's ``launcher.name`` records it). Who requeues is not among it: a rank asks the batch host
        when one listens (hpc_train.compute.runtime.requeue), whatever started it."""
        return {key: value for key, value in asdict(self).items() if key == "slurm_job"}


LAUNCHERS: Dict[str, LauncherKind] = {
    kind.name: kind
    for kind in (
        LauncherKind("local", on_this_machine=True, submits=False, slurm_job=False, prepares_only=False),
        LauncherKind("slurm", on_this_machine=False, submits=True, slurm_job=True, prepares_only=False),
        LauncherKind("sbatch", on_this_machine=False, submits=False, slurm_job=True, prepares_only=True),
    )
}
DEFAULT_LAUNCHER = "local"


@dataclass(frozen=True)
class AppLauncherKind:
    """A launcher for any Hydra app's sweeps (``hydra/launcher=<name>``): the backend its jobs run on (a name of
    LAUNCHERS) and its class, which Hydra instantiates only from under ``hydra_plugins``."""

    name: str  # its name in hydra/launcher
    backend: str  # the launcher.name of the backend that runs its jobs
    class_name: str  # its class in APP_PLUGIN

    @property
    def target(self) -> str:
        """The class's dotted path, as a ``_target_`` names it."""
        return f"{APP_PLUGIN}.{self.class_name}"


APP_PLUGIN = "hydra_plugins.hpc_train_launcher"
APP_SLURM = AppLauncherKind("hpc_train_slurm", "slurm", "AppSlurmLauncher")
APP_LOCAL = AppLauncherKind("hpc_train_local", "local", "AppLocalLauncher")
APP_LAUNCHERS: Dict[str, AppLauncherKind] = {kind.name: kind for kind in (APP_SLURM, APP_LOCAL)}
_PICK_ONE = "pick the launcher with " + ", ".join(f"launcher={name}" for name in LAUNCHERS) + "."


def launcher_kind(name: Any) -> LauncherKind:
    """The kind of launcher ``launcher.name`` names; a name that is none of LAUNCHERS is refused (ConfigError)."""
    kind = LAUNCHERS.get(str(name))
    if kind is None:
        raise ConfigError("launcher.name", f"{name!r} is no launcher.", _PICK_ONE)
    return kind


PACK_KEYS = ("allocations", "nodes", "gpus_per_node", "time")  # launcher.pack's keys


def pack_node(value: Any) -> Problem:
    """launcher.pack: a mapping of PACK_KEYS (each key checked by its own rule)."""
    if not hasattr(value, "items"):
        return f"must be a mapping of {', '.join(PACK_KEYS)}, got {show(value)}"
    unknown = [str(k) for k in value if k not in PACK_KEYS]
    return f"has no key {unknown[0]!r} (it has {', '.join(PACK_KEYS)})" if unknown else None


pack_node.what = f"mapping of {', '.join(PACK_KEYS)}"  # type: ignore[attr-defined]


def signal_name(value: Any) -> str:
    """launcher.signal as Slurm and submitit spell it (USR2), however it was written (usr2, SIGUSR2): the one
    normalisation the check, the sbatch line and the ranks' handler all use."""
    return str(value).upper().removeprefix("SIG")


RULES: Tuple[Rule, ...] = (
    R(
        "launcher.name",
        one_of(*LAUNCHERS),
        DEFAULT_LAUNCHER,
        required=True,
        fix=_PICK_ONE,
        doc=(
            "Where the job runs: local (this machine), slurm (submitted with submitit) or sbatch (inside your own "
            "sbatch script)."
        ),
    ),
    R(
        "launcher.wait",
        flag,
        "true",
        fix="use launcher.wait=true (follow the job to its end) or launcher.wait=false.",
        doc="Slurm: follow the job until it ends and print its summary.",
        default=False,
    ),
    R(
        "launcher.signal",
        one_of("USR1", "USR2", normalize=signal_name),
        "USR2",
        fix="use launcher.signal=USR2 (the default) or launcher.signal=USR1.",
        doc="The requeue signal (USR1 | USR2): checkpoint after the current step, then requeue.",
        default="USR2",
    ),
    R(
        "launcher.signal_delay_s",
        whole(1, 65535),
        120,
        fix="set e.g. launcher.signal_delay_s=120: enough to finish a step and write a checkpoint.",
        doc="Seconds before the time limit Slurm sends the requeue signal (#SBATCH --signal=USR2@120).",
        default=120,
    ),
    R(
        "launcher.master_port",
        whole(1, 65535),
        29500,
        null="a free port",
        doc="The rendezvous port of a local run; null: a free port.",
        default=None,
    ),
    R(
        "launcher.array_parallelism",
        whole(1, INT64_MAX),
        64,
        null="the cluster profile's cluster.array_parallelism, else no throttle",
        doc=(
            "A sweep's arrays run at most this many jobs at once (--array=0-N%P); null: the cluster profile's, else "
            "no throttle."
        ),
        default=None,
    ),
    R(
        "launcher.pack",
        pack_node,
        "{allocations: 2, gpus_per_node: 4}",
        fix=(
            "set launcher.pack.allocations=N (and launcher.pack.nodes, gpus_per_node, time), or leave launcher.pack "
            "out."
        ),
        doc="How a sweep's runs are packed into a few allocations (the keys below); launcher=slurm's.",
        left_out="the launchers other than slurm do not pack",
        mapping=True,
    ),
    R(
        "launcher.pack.allocations",
        whole(1, 10_000),
        2,
        null="no packing: one job (or array task) per run",
        doc="Pack a sweep's runs into this many Slurm jobs, each run a job step (srun --exact); null: one job per run.",
        default=None,
    ),
    R(
        "launcher.pack.nodes",
        whole(1, 10_000),
        1,
        doc="Nodes of each packed allocation (a run may span several of them).",
        default=1,
    ),
    R(
        "launcher.pack.gpus_per_node",
        whole(1, 1024),
        4,
        null="the cluster profile's cluster.gpus_per_node",
        doc="GPUs per node of each packed allocation; null: the cluster profile's gpus_per_node.",
        default=None,
    ),
    R(
        "launcher.pack.time",
        slurm_time,
        "04:00:00",
        null="the cluster profile's cluster.time",
        fix=(
            "set launcher.pack.time=04:00:00 (HH:MM:SS, D-HH:MM:SS) or a number of minutes, or null (the cluster "
            "profile's)."
        ),
        doc="Time limit of each packed allocation; null: the cluster profile's cluster.time.",
        default=None,
    ),
)
