"""The resources group: the nodes (a count, or a range Slurm chooses from), GPUs per node and time limit a job asks
for."""

from __future__ import annotations

from typing import Tuple

from hpc_train.config.checks import count_or_range, one_of, slurm_time, whole
from hpc_train.config.rule import R, Rule

RULES: Tuple[Rule, ...] = (
    R(
        "resources.nodes",
        count_or_range(1, 100_000),
        1,
        required=True,
        fix=(
            "set resources.nodes=1 or more, or a range MIN-MAX with 1 <= MIN < MAX such as resources.nodes=2-4"
            " (strategy=ddp, fsdp or mesh)."
        ),
        doc=(
            "Nodes of the job: N, or a range MIN-MAX (e.g. 2-4) that Slurm fills with as many nodes as it can give,"
            " at least MIN (strategy=ddp, fsdp or mesh: their checkpoints resume at another node count)."
        ),
    ),
    R(
        "resources.gpus_per_node",
        whole(1, 1024),
        1,
        null="the cluster profile's; locally all GPUs",
        required=True,
        fix="set resources.gpus_per_node=1 or more (at most 1024), or null for the cluster profile's value.",
        doc=(
            "GPUs per node the job uses; null: the cluster profile's value (locally: all GPUs, or 2 CPU workers "
            "without GPUs)."
        ),
    ),
    R(
        "resources.time",
        slurm_time,
        "01:00:00",
        null="the cluster profile's",
        required=True,
        fix=(
            "set resources.time=01:00:00 (HH:MM:SS) or a number of minutes such as resources.time=90, or null for the"
            " cluster profile's."
        ),
        doc="Wall-clock limit (minutes or HH:MM:SS); null: the cluster profile's default.",
    ),
    R(
        "resources.memory_check",
        one_of("auto", "always", "never"),
        "never",
        fix=(
            "use resources.memory_check=auto (when the GPU's memory is known), always (the GPU's memory must be"
            " known) or never."
        ),
        doc=(
            "Estimate each rank's peak GPU memory before queueing and refuse a job that will not fit, with the"
            " settings that do: auto: when the GPU's memory is known (cluster.gpu_type, cluster.gpu_memory_gb) and"
            " the job is not a script; always (refused where it cannot run); never."
        ),
        default="auto",
    ),
)
