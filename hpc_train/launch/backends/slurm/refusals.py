"""Slurm's words for a refused submission, turned into the key to change and how (a table, first match wins)."""

from __future__ import annotations

from typing import Sequence

from hpc_train.config.errors import ConfigError

# Slurm's words for a refused submission -> the key to change and how (first match wins).
_REFUSALS = (
    (
        "cpu count per node",
        "cluster.cpus_per_gpu",
        (
            "lower cluster.cpus_per_gpu (or resources.gpus_per_node) to what the partition's nodes have (`sinfo -N -o"
            " '%N %c %G %m'`)."
        ),
    ),
    (
        "memory specification",
        "cluster.mem_gb",
        "lower cluster.mem_gb, or set cluster.mem_gb=null for the partition's default.",
    ),
    ("invalid partition", "cluster.partition", "pass cluster.partition=<a partition `sinfo` lists>."),
    ("invalid account", "cluster.account", "pass cluster.account=<an account `sacctmgr show assoc user=$USER` lists>."),
    (
        "invalid qos",
        "cluster.qos",
        "pass cluster.qos=<a QoS your account may use (`sacctmgr show assoc user=$USER format=account,qos`)>.",
    ),
    (
        "feature specification",
        "cluster.constraint",
        "pass cluster.constraint=<a feature `sinfo -o '%N %f'` lists>, or cluster.constraint=null.",
    ),
    ("time limit", "resources.time", "ask for a shorter resources.time (see the partition's MaxTime in `sinfo`)."),
    (
        "gres",
        "resources.gpus_per_node",
        "lower resources.gpus_per_node, or set cluster.gpu_flag=gpus-per-node if your site wants --gpus-per-node.",
    ),
    (
        "unrecognized option",
        "cluster.extra",
        "remove or correct that option in cluster.extra (`sbatch --help` lists the valid ones).",
    ),
    ("invalid --", "cluster.extra", "correct that option's value in cluster.extra."),
    (
        "node configuration is not available",
        "resources",
        (
            "ask for what one node of the partition has (`sinfo -N -o '%N %c %G %m'`): resources.gpus_per_node,"
            " cluster.cpus_per_gpu, cluster.mem_gb, cluster.constraint."
        ),
    ),
)


def refusal_error(slurm_says: str, cancelled: Sequence[str] = ()) -> ConfigError:
    """One ConfigError for a failed sbatch: Slurm's own words, the key they point at, and the fix."""
    words = (
        " ".join(
            line.strip() for line in slurm_says.strip().splitlines() if line.strip() and not line.startswith("Try ")
        )
        or "sbatch failed without a message"
    )
    key, fix = (
        "cluster",
        (
            "print the sbatch script with dry_run=true and compare it with your site's limits (`sinfo`, `sacctmgr show"
            " assoc user=$USER`)."
        ),
    )
    lowered = words.lower()
    for needle, known_key, known_fix in _REFUSALS:
        if needle in lowered:
            key, fix = known_key, known_fix
            break
    note = (
        f" The jobs this command had already queued ({', '.join(cancelled)}) were cancelled: nothing of it is left."
        if cancelled
        else ""
    )
    return ConfigError(key, f"Slurm refused the job: {words}.{note}", fix)
