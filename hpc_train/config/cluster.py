"""The cluster group: a site profile's sbatch settings.

The per-GPU-type table of jean_zay-like profiles comes first: the keys below it interpolate it."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from hpc_train.config.checks import (
    DECLARED_ONLY,
    INT64_MAX,
    PATH_TEXT,
    SLURM_WORD,
    SLURM_WORDS,
    list_of,
    one_of,
    peak_table,
    qos_row,
    sbatch_options,
    slurm_time,
    text,
    whole,
)
from hpc_train.config.rule import R, Rule

# The precisions a device's dense peak is given for (cluster.gpu_peak_tflops; hpc_train.contracts.gpu_peaks' table).
PEAK_PRECISIONS = ("bf16", "fp16", "tf32", "fp32")


def interconnect(value: Any) -> Optional[str]:
    """cluster.interconnect: {intra: LINK, inter: LINK}, a LINK a name or GB/s (its names read by the cost model)."""
    if value is None:
        return None
    keys = {"intra", "inter", "intra_latency_us", "inter_latency_us"}
    if not hasattr(value, "items") or not value or set(value) - keys:
        return f"must be a mapping of intra, inter (a link name or GB/s) and their _latency_us, got {value!r}"
    for link, speed in value.items():
        if str(link).endswith("_latency_us") and positive(speed):
            return f"gives {link} {speed!r}: a latency is a positive number of microseconds"
        if not str(link).endswith("_latency_us") and not (isinstance(speed, str) and speed) and positive(speed):
            return f"gives {link} {speed!r}: a link is a name such as infiniband or a positive number of GB/s"
    return None


interconnect.what = "mapping: intra | inter -> link name | GB/s; intra_latency_us | inter_latency_us -> us"  # type: ignore[attr-defined]


def positive(value: Any) -> Optional[str]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return None
    return f"must be a positive number, got {value!r}"


positive.what = "number > 0"  # type: ignore[attr-defined]


RULES: Tuple[Rule, ...] = (
    R(
        "cluster.array_parallelism",
        whole(1, INT64_MAX),
        64,
        null="no throttle",
        doc="The site's default throttle for sweeps (launcher.array_parallelism overrides it); null: none.",
        default=None,
    ),
    R(
        "cluster.gpu_type",
        DECLARED_ONLY,
        "v100",
        doc="Profiles with a types table: the GPU type whose row the keys below read (check_profile_type checks it).",
        left_out="a profile without a per-GPU-type table",
    ),
    R(
        "cluster.types.*.memory_gb",
        whole(1, 4096),
        32,
        doc="Per GPU type: one GPU's memory in GB as its datasheet names it (what cluster.gpu_memory_gb reads).",
        left_out="a profile without a per-GPU-type table, or a type whose memory the table knows",
    ),
    R(
        "cluster.types.*.partition",
        SLURM_WORDS,
        "gpu_p13",
        doc="Per GPU type: its partition.",
        left_out="a profile without a per-GPU-type table",
    ),
    R(
        "cluster.types.*.constraint",
        text(r"[A-Za-z0-9_.,:&|!*\[\]()@+-]+", "a Slurm constraint (ASCII, no spaces)", 1024),
        "v100-32g",
        doc="Per GPU type: its --constraint.",
        left_out="a profile without a per-GPU-type table",
    ),
    R(
        "cluster.types.*.gpus_per_node",
        whole(1, 1024),
        4,
        doc="Per GPU type: GPUs per node.",
        left_out="a profile without a per-GPU-type table",
    ),
    R(
        "cluster.types.*.cpus_per_gpu",
        whole(1, 1024),
        10,
        doc="Per GPU type: CPU cores per GPU.",
        left_out="a profile without a per-GPU-type table",
    ),
    R(
        "cluster.types.*.qos_prefix",
        SLURM_WORD,
        "qos_gpu",
        doc="Per GPU type: the prefix of its QoS names (qos_gpu-t3 ...).",
        left_out="a profile without a per-GPU-type table",
    ),
    R(
        "cluster.gpu_memory_gb",
        whole(1, 4096),
        80,
        null="from the table of GPU memory by cluster.gpu_type (none without a type)",
        fix=(
            "give one GPU's memory as its datasheet names it in GB, e.g. cluster.gpu_memory_gb=80 for an 80 GB card,"
            " or cluster.gpu_memory_gb=null to read it from cluster.gpu_type."
        ),
        doc=(
            "One GPU's memory in GB as its datasheet names it (32 for a V100 32GB), which the memory check before"
            " queueing compares the job's estimate against; null: from hpc_train's table by cluster.gpu_type."
        ),
        default=None,
    ),
    R(
        "cluster.name",
        text(r"[A-Za-z0-9_.+-]+", "a profile name (ASCII letters, digits, '.', '_', '+', '-')", 200),
        "mysite",
        required=True,
        doc="The profile's name (shown in messages).",
    ),
    R(
        "cluster.gpus_per_node",
        whole(1, 1024),
        4,
        null="locally: count the GPUs",
        doc="GPUs per node of the cluster; null: count them (nvidia-smi), 2 CPU workers when there are none.",
        default=None,
    ),
    R(
        "cluster.cpus_per_gpu",
        whole(1, 1024),
        4,
        null="1",
        doc="--cpus-per-task = cpus_per_gpu x GPUs per task; null: 1.",
        default=None,
    ),
    R(
        "cluster.partition",
        SLURM_WORDS,
        "gpu",
        null="the cluster's default partition",
        doc="--partition; null: the cluster's default partition.",
        default=None,
    ),
    R(
        "cluster.account",
        SLURM_WORD,
        "myproject",
        null="no --account",
        doc="--account; null: none (or from account_env).",
        default=None,
    ),
    R(
        "cluster.account_env",
        text(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name"),
        "IDRPROJ",
        null="no account from the environment",
        doc="The environment variable holding the account (e.g. IDRPROJ); null: none.",
        default=None,
    ),
    R(
        "cluster.account_suffix",
        text(r"[A-Za-z0-9_.@:+-]+", "ASCII text without spaces", 255, min_len=0),
        "@v100",
        fix="set e.g. cluster.account_suffix=@v100, or cluster.account_suffix='' for none.",
        doc="Appended to the account read from account_env (e.g. @v100).",
        default="",
    ),
    R(
        "cluster.qos",
        SLURM_WORD,
        "qos_gpu-t3",
        null="from qos_by_time, else none",
        doc="--qos; null: from qos_by_time, else none.",
        default=None,
    ),
    R(
        "cluster.qos_by_time",
        list_of(qos_row, "{max_minutes: N, qos: name} rows"),
        "[]",
        null="no QoS by time",
        fix=(
            "give rows such as cluster.qos_by_time='[{max_minutes:120,qos:short}]', or cluster.qos_by_time=[] for none."
        ),
        doc="Rows {max_minutes: N, qos: name}: the first row the time limit fits in gives --qos.",
        default=[],
    ),
    R(
        "cluster.constraint",
        text(r"[A-Za-z0-9_.,:&|!*\[\]()@+-]+", "a Slurm constraint (ASCII, no spaces)", 1024),
        "a100",
        null="no --constraint",
        doc="--constraint, e.g. a100; null: none.",
        default=None,
    ),
    R(
        "cluster.hint",
        one_of("nomultithread", "multithread", "compute_bound", "memory_bound"),
        "nomultithread",
        null="no --hint",
        doc="--hint, e.g. nomultithread; null: none.",
        default=None,
    ),
    R(
        "cluster.gpu_flag",
        one_of("gres", "gpus-per-node"),
        "gres",
        fix="use cluster.gpu_flag=gres or cluster.gpu_flag=gpus-per-node.",
        doc="How GPUs are asked for: gres (--gres=gpu:G) or gpus-per-node (--gpus-per-node=G).",
        default="gres",
    ),
    R(
        "cluster.time",
        slurm_time,
        "01:00:00",
        fix="set cluster.time=01:00:00 (HH:MM:SS) or a number of minutes.",
        doc="The profile's default wall-clock limit (resources.time overrides it).",
        left_out="resources.time must give the time limit",
    ),
    R(
        "cluster.mem_gb",
        whole(1, 2**20),
        64,
        null="the cluster's default",
        doc="--mem per node in GB; null: the cluster's default.",
        default=None,
    ),
    R(
        "cluster.setup",
        list_of(text(what="a shell command line"), "shell command lines"),
        "'[module purge,module load pytorch-gpu]'",
        null="no setup lines",
        fix=(
            "give one plain command per list entry, e.g. cluster.setup='[module purge,module load pytorch-gpu]', or"
            " cluster.setup=[]."
        ),
        doc="Shell lines run before srun, e.g. [module purge, module load pytorch-gpu].",
        default=[],
    ),
    R(
        "cluster.login",
        text(
            r"(ssh://)?[A-Za-z0-9_\[][A-Za-z0-9_.@%+\[\]:-]*",
            "an SSH destination (user@host, ssh://user@host:port or a ~/.ssh/config alias)",
            1024,
        ),
        "me@cluster.example.org",
        null="every command runs on this machine",
        fix=(
            "give the cluster's login node as ssh takes it, e.g. cluster.login=me@login.cluster.org,"
            " cluster.login=ssh://me@login.cluster.org:2222 or an alias of your ~/.ssh/config; or cluster.login=null to"
            " submit from this machine."
        ),
        doc=(
            "Submit from this machine over SSH (the project synced, the cluster's own hpc_train runs the job);"
            " null: this machine is the login node."
        ),
        default=None,
    ),
    R(
        "cluster.remote_dir",
        PATH_TEXT,
        "~/hpc-train/myproject",
        null="~/hpc-train/<name of the submitting directory>",
        doc="With cluster.login: the cluster folder of the synced project and its run dirs (~: the cluster home).",
        default=None,
    ),
    R(
        "cluster.remote_python",
        text(what="a command (the cluster's Python with hpc_train and torch)"),
        "~/venvs/train/bin/python",
        doc="With cluster.login: the cluster's Python that has hpc_train and torch (run after cluster.setup's lines).",
        default="python3",
    ),
    R(
        "cluster.sync",
        one_of("auto", "rsync", "ssh"),
        "ssh",
        doc=(
            "With cluster.login: how the project is copied: rsync (both sides need it), ssh (a stream through ssh),"
            " auto: rsync where both sides have it."
        ),
        default="auto",
    ),
    R(
        "cluster.sync_limit_mb",
        whole(1, 2**30),
        200,
        doc="With cluster.login: the most the synced project may hold (MB); more is refused before a byte is sent.",
        default=200,
    ),
    R(
        "cluster.extra",
        sbatch_options,
        "{exclusive:true}",
        null="no extra options",
        fix="give sbatch options as a mapping, e.g. +cluster.extra.mail-type=END or cluster.extra={} for none.",
        doc="Any other sbatch option as {option: value}, e.g. {exclusive: true, mail-type: END}.",
        default={},
        mapping=True,
    ),
    R(
        "cluster.gpu_peak_tflops",
        peak_table(PEAK_PRECISIONS),
        "{bf16:989,tf32:494}",
        null="from hpc_train's table, by the name torch gives the device",
        fix=(
            "give the device's dense peak TFLOP/s per precision, e.g. 'cluster.gpu_peak_tflops={bf16:989,tf32:494}'"
            f" (quoted for the shell; precisions: {', '.join(PEAK_PRECISIONS)}), or cluster.gpu_peak_tflops=null to"
            " use hpc_train's table."
        ),
        doc="The dense peak TFLOP/s per GPU for each precision that MFU is computed against; null: hpc_train's table"
        " by the device's name (none for a CPU).",
        default=None,
        mapping=True,
    ),
    R(
        "cluster.interconnect",
        interconnect,
        "{intra:nvlink,inter:infiniband}",
        null="nvlink inside a node and infiniband across (CPU workers: loopback and ethernet)",
        fix=(
            "give each link as a name (nvlink, pcie, infiniband, ethernet, loopback) or GB/s, e.g."
            " 'cluster.interconnect={intra:nvlink,inter:50}' (quoted for the shell), or cluster.interconnect=null."
        ),
        doc=(
            "strategy=auto's cost model: the bandwidth a rank sends at inside a node (intra) and across nodes (inter),"
            " each a link of hpc_train's table (nvlink, pcie, infiniband, ethernet, loopback) or GB/s; and what one"
            " collective costs on each whatever its size (intra_latency_us, inter_latency_us; default: the link's)."
        ),
        default=None,
        mapping=True,
    ),
    R(
        "cluster.cpu_gflops",
        positive,
        50,
        null="20 GFLOP/s a worker",
        doc="strategy=auto's cost model on CPU workers: the GFLOP/s one worker sustains (measure it on your machine).",
        default=None,
    ),
)
