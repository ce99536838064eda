"""Check a composed config before anything runs or is queued.

Each check raises ConfigError naming the key and the fix. ``check_keys`` first checks every
key's type and range against the declarations in ``hpc_train.config`` (before the layout is computed);
``validate`` then checks what the types alone do not say (keys that must agree with each
other or with the layout, files, packages). Only cheap, local checks live here (no torch, no
network); cluster-side checks (partition names, node capacity) live with the Slurm launcher.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import launcher_kind
from hpc_train.config.targets import public_name
from hpc_train.config.view import ConfigView, plain
from hpc_train.containers.checks import check_container
from hpc_train.containers.settings import ContainerSettings
from hpc_train.contracts import logger_table
from hpc_train.contracts.fingerprint import differences, fingerprint, read_header_fingerprint
from hpc_train.contracts.strategy_table import KINDS
from hpc_train.launch.planning.objective import check_objective
from hpc_train.launch.planning.parallelism import Parallelism
from hpc_train.launch.planning.replica_checks import check_replica_groups
from hpc_train.processes.script_command import is_script_job
from hpc_train.records import hang as hang_watch
from hpc_train.records import rundir

RESUME_WORDS = ("auto", "never")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}


def normalize_precision(value: object) -> str:
    return str(value).lower()


def check_trainer(
    cfg: ConfigView, parallel: Parallelism, every: Sequence[Parallelism] = (), run_dir: Optional[Path] = None
) -> None:
    """What the types alone do not say: training stops, the global batch splits evenly, the recipe's keys agree.
    `every`: each node count's parallelism, for a range of nodes (the batch must split at every count); `run_dir`:
    where a checkpoint this run continues is looked for (its global batch is the one that must split)."""
    trainer = cfg.trainer
    if trainer.epochs is None and trainer.max_steps is None:
        raise ConfigError(
            "trainer.epochs",
            "both trainer.epochs and trainer.max_steps are null, so training would never stop.",
            "set trainer.epochs=5 or trainer.max_steps=1000.",
        )
    if run_dir is not None:
        _check_continued_batch_split(cfg, parallel, run_dir)
    _check_batch_split(trainer, parallel, every)
    _check_schedule(trainer)
    if trainer.ema_decay is not None and parallel.kind.staged:
        raise ConfigError(
            "trainer.ema_decay",
            f"{parallel.kind.spelling} cuts the model into stages; the weight average is kept for a whole model.",
            "use it with strategy=single, dp, ddp or fsdp, or set trainer.ema_decay=null.",
        )


def batch_divisor(trainer: ConfigView, parallel: Parallelism) -> int:
    """What the global batch must be a multiple of: data-parallel ranks x accumulation steps x micro-batches."""
    return parallel.data_parallel_size * parallel.chunks * int(trainer.grad_accum_steps)


def _check_batch_split(trainer: ConfigView, parallel: Parallelism, every: Sequence[Parallelism] = ()) -> None:
    """The global batch splits over the data-parallel ranks, then into trainer.grad_accum_steps micro-batches (then
    into strategy.chunks pipeline micro-batches); at every node count of a range (`every`), whose suggested batch
    splits at all of them."""
    batch = trainer.batch_size
    accum = int(trainer.grad_accum_steps)
    replicas, chunks = parallel.data_parallel_size, parallel.chunks
    if accum > 1 and parallel.stage_ranks:
        raise ConfigError(
            "trainer.grad_accum_steps",
            f"the pipeline's schedule (one rank a stage) already cuts each batch into strategy.chunks={chunks}"
            " micro-batches and steps the optimizer once per schedule; it does not accumulate over several schedules.",
            f"set trainer.grad_accum_steps=1 and raise strategy.chunks instead (e.g. strategy.chunks={chunks * accum})"
            + (
                ", or use strategy.engine=native, where accumulation composes with the micro-batches."
                if parallel.layout.strategy == "pipelining"
                else "."
            ),
        )
    divisor = batch_divisor(trainer, parallel)
    if batch % divisor != 0:
        divisor = math.lcm(divisor, *(batch_divisor(trainer, other) for other in every))
        suggestion = max(divisor, (batch // divisor) * divisor)
        raise ConfigError(
            "trainer.batch_size",
            f"the global batch {batch} does not split evenly over the {_batch_parts(replicas, accum, chunks)}"
            f" ({parallel.layout.describe()}).",
            f"use a multiple of {divisor}, e.g. trainer.batch_size={suggestion}"
            + (", or change trainer.grad_accum_steps." if accum > 1 else "."),
        )


def _batch_parts(replicas: int, accum: int, chunks: int) -> str:
    """What a global batch is split over, in words: the data-parallel ranks, micro-batches and pipeline chunks."""
    parts = [f"world size {replicas}" if chunks == 1 and accum == 1 else f"data-parallel size {replicas}"]
    if accum > 1:
        parts.append(f"trainer.grad_accum_steps={accum}")
    if chunks > 1:
        parts.append(f"strategy.chunks={chunks}")
    return " x ".join(parts)


def _check_continued_batch_split(cfg: ConfigView, parallel: Parallelism, run_dir: Path) -> None:
    """A run that continues a checkpoint keeps its global batch, so when that batch does not split over this run's
    data-parallel ranks the fix is another number of ranks (or a fresh start): another trainer.batch_size would be
    refused next, as a setting the checkpoint does not share."""
    target = rundir.newest_checkpoint(str(cfg.resume), Path(run_dir))
    saved = read_header_fingerprint(target) if target is not None else None
    if not saved or "trainer.batch_size" not in saved:
        return
    batch, accum, chunks = int(saved["trainer.batch_size"]), int(cfg.trainer.grad_accum_steps), parallel.chunks
    replicas = parallel.data_parallel_size
    if batch % (replicas * chunks * accum) == 0:
        return
    sizes = [str(n) for n in range(1, batch + 1) if batch % (n * chunks * accum) == 0]
    over = _batch_parts(replicas, accum, chunks)
    raise ConfigError(
        "resources.gpus_per_node",
        f"this run continues the checkpoint {target}, whose global batch of {batch} (trainer.batch_size, kept by a"
        f" resumed run) does not split evenly over the {over} ({parallel.layout.describe()}).",
        f"resume on a data-parallel size of {', '.join(sizes[:-1])} or {sizes[-1]} ranks (resources.nodes x"
        " resources.gpus_per_node)"
        + (", or change trainer.grad_accum_steps" if accum > 1 else "")
        + ", or start over with resume=never.",
    )


def _check_schedule(trainer: ConfigView) -> None:
    schedule = trainer.lr_schedule
    if isinstance(schedule, Mapping):
        if int(trainer.lr_warmup_steps) > 0:
            raise ConfigError(
                "trainer.lr_warmup_steps",
                f"trainer.lr_schedule is your own scheduler ({schedule.get('_target_')}), which sets its own warm-up;"
                " trainer.lr_warmup_steps applies to the built-in schedules only.",
                "set trainer.lr_warmup_steps=0 and give the warm-up to your scheduler (e.g. OneCycleLR's pct_start),"
                " or use a built-in trainer.lr_schedule.",
            )
        return
    min_lr = trainer.min_lr
    optimizer_lr = trainer.optimizer.get("lr") if isinstance(trainer.optimizer, Mapping) else None
    lr = optimizer_lr if optimizer_lr is not None else trainer.lr
    if schedule == "cosine" and min_lr > lr:
        raise ConfigError(
            "trainer.min_lr",
            f"trainer.min_lr={min_lr} is above the learning rate {lr} (trainer.lr), so the cosine schedule would"
            " rise instead of decay.",
            "set trainer.min_lr below trainer.lr (nanoGPT and timm use about lr / 10, e.g."
            f" trainer.min_lr={lr / 10:g}).",
        )


def check_timeouts(cfg: ConfigView) -> None:
    """The hang watchdog must speak before a collective's timeout does (it names the stuck rank; the timeout blames
    the rank that waited)."""
    trainer = cfg.trainer
    hang, dist = trainer.hang_timeout_s, trainer.dist_timeout_s
    if hang is not None and hang != hang_watch.AUTO and float(dist) <= float(hang):
        raise ConfigError(
            "trainer.dist_timeout_s",
            f"trainer.dist_timeout_s={dist} is not larger than trainer.hang_timeout_s={hang}: a stuck collective would"
            " time out on the ranks that wait in it, and they would be blamed, before the hang watchdog names the"
            " rank that is stuck.",
            f"raise trainer.dist_timeout_s (e.g. to {int(float(hang) * 2) + 60}) or lower trainer.hang_timeout_s.",
        )


def check_activation_checkpointing(cfg: ConfigView, parallel: Parallelism) -> None:
    """Recomputing blocks in the backward pass needs the whole model in one process."""
    mode = str(cfg.trainer.activation_checkpointing)
    if mode != "none" and (parallel.kind.staged or parallel.stage_ranks):
        spelling = (
            "strategy=mesh with strategy.pp > 1" if parallel.layout.strategy == "mesh" else parallel.kind.spelling
        )
        raise ConfigError(
            "trainer.activation_checkpointing",
            f"{spelling} runs the model's stages itself; activation checkpointing wraps the blocks of a whole model.",
            "use it with strategy=single, dp, ddp, fsdp or mesh without pipeline stages, or set"
            " trainer.activation_checkpointing=none.",
        )


def check_strategy(cfg: ConfigView, parallel: Parallelism) -> None:
    """What a split strategy's stages and micro-batches need from the training settings (the rest is resolved in
    ``parallelism.resolve_parallelism``)."""
    if parallel.split is None:
        return
    if cfg.trainer.step is not None:
        raise ConfigError(
            "trainer.step",
            f"{parallel.kind.spelling} cuts the model into stages and computes trainer.loss on the last"
            " stage's output, so it cannot run a step that calls the whole model (the model's own loss included).",
            "train with strategy=ddp (or single, dp), or set trainer.step=null and give the loss as trainer.loss on"
            " (input, target) pairs.",
        )
    if parallel.stage_ranks and normalize_precision(cfg.trainer.precision) == "16":
        raise ConfigError(
            "trainer.precision",
            "fp16 needs loss scaling, which the pipeline's schedules (one rank a stage) do not apply.",
            "use trainer.precision=bf16 (no scaler needed)"
            + (" or strategy.engine=native." if parallel.layout.strategy == "pipelining" else ", or strategy.pp=1."),
        )
    chunks = parallel.split.chunks
    per_rank = cfg.trainer.batch_size // parallel.data_parallel_size
    if chunks and per_rank < chunks:
        raise ConfigError(
            "strategy.chunks",
            f"{chunks} micro-batches is more than the per-rank batch of {per_rank} samples.",
            f"use strategy.chunks<={per_rank} or raise trainer.batch_size.",
        )


IMAGE_FOLDER_TARGET = "hpc_train.datasets.image_folder"  # public; its internal path means the same


def check_data(cfg: ConfigView) -> None:
    data = cfg.data
    if public_name(str(data.train._target_)) == IMAGE_FOLDER_TARGET:
        _check_image_folder(data)


def _check_image_folder(data: ConfigView) -> None:
    """data=imagefolder: the folders exist, hold images, and as many classes as data.num_classes says."""
    if data.is_missing("root") or not data.get("root"):
        raise ConfigError(
            "data.root",
            "data=imagefolder needs the dataset folder, and none was given.",
            "pass data.root=/path/to/dataset, a folder holding train/ and val/ with one sub-folder per class.",
        )
    root = Path(str(data.root)).expanduser()
    if not root.is_dir():
        raise ConfigError(
            "data.root",
            f"{root} does not exist or is not a folder.",
            "pass data.root=/path/to/dataset, a folder holding train/ and val/ with one sub-folder per class.",
        )
    if data.is_missing("num_classes"):
        raise ConfigError(
            "data.num_classes",
            "data=imagefolder needs the number of classes.",
            "pass data.num_classes=N, the number of class folders under train/.",
        )
    for split_key in ("train_dir", "val_dir"):
        split = root / str(data[split_key])
        classes = sorted(p.name for p in split.iterdir() if p.is_dir()) if split.is_dir() else []
        if not classes:
            raise ConfigError(
                "data.root",
                f"{split} has no class folders.",
                f"put one folder per class under {split}, or point data.root (and data.{split_key}) at the right"
                " place.",
            )
        if len(classes) != int(data.num_classes):
            raise ConfigError(
                "data.num_classes",
                f"{split} has {len(classes)} class folders but data.num_classes={data.num_classes}.",
                f"set data.num_classes={len(classes)} or fix the folders.",
            )
        has_image = any(f.suffix.lower() in IMAGE_SUFFIXES for c in classes for f in (split / c).iterdir())
        if not has_image:
            raise ConfigError(
                "data.root",
                f"the class folders under {split} hold no images.",
                "check data.root: each class folder needs image files (.jpg, .png, ...).",
            )


def code_dirs() -> List[str]:
    """Where the job imports the user's code from: the submitting directory, then PYTHONPATH."""
    dirs = [os.getcwd(), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return list(dict.fromkeys(str(Path(d).absolute()) for d in dirs))


def _targets(node: object, path: str) -> List[Tuple[str, str]]:
    """(key, dotted path) of every _target_ in the config."""
    found: List[Tuple[str, str]] = []
    if type(node) is dict or isinstance(node, Mapping):
        for key, child in node.items():
            if key == "_target_":
                if isinstance(child, str):
                    found.append((path or "_target_", child))
            else:
                found.extend(_targets(child, f"{path}.{key}" if path else str(key)))
    elif type(node) is list:
        for index, child in enumerate(node):
            found.extend(_targets(child, f"{path}[{index}]"))
    return found


@functools.lru_cache(maxsize=None)
def _findable(top: str, search: Tuple[str, ...]) -> bool:
    """find_spec of a top-level package, once per package and search path (a sweep asks for every job)."""
    return bool(top) and (
        importlib.machinery.PathFinder.find_spec(top, list(search)) is not None
        or importlib.util.find_spec(top) is not None
    )


def check_targets(cfg: ConfigView) -> None:
    """Every _target_'s top-level package is findable (find_spec imports nothing: no torch here)."""
    search = tuple(code_dirs() + sys.path)
    for key, target in _targets(cfg.raw(), ""):
        top = target.split(".")[0]
        if not _findable(top, search):
            raise ConfigError(
                f"{key}._target_",
                f"{target!r}: no module {top!r} can be found from {os.getcwd()} or PYTHONPATH in this Python"
                " environment.",
                f"run hpc-train from the folder that holds {top}/ (or {top}.py), add its parent folder to PYTHONPATH,"
                " or pip install -e your package; the job imports it from the same places.",
            )


def check_resume(cfg: ConfigView) -> None:
    resume = str(cfg.resume)
    if resume in RESUME_WORDS:
        return
    target = Path(resume).expanduser()
    if target.is_dir() and not rundir.is_checkpoint(target):
        folder = rundir.resume_target(resume, Path("."))
        if not rundir.list_checkpoints(folder):
            raise ConfigError(
                "resume",
                f"{folder} holds no checkpoint (step_*.ckpt, or step_*/ of fsdp).",
                "point resume= at a run dir with a checkpoints/ folder or at one checkpoint (a step_*.ckpt file or an"
                " fsdp step_*/ directory), or use resume=auto / resume=never.",
            )
        return
    if target.is_dir():
        return
    if not target.is_file():
        raise ConfigError(
            "resume",
            f"{resume} is neither a checkpoint file nor a run dir.",
            "use resume=auto (newest checkpoint in the run dir), resume=never, resume=/path/to/run_dir or"
            " resume=/path/to/checkpoints/step_000000100.ckpt.",
        )


def check_logger(cfg: ConfigView) -> None:
    """The loggers exist and their packages are here (looked up without importing them), before anything is queued."""
    node = cfg.select("logger", default=None)  # no logger node (~logger): jsonl
    choice = logger_table.chosen(node)
    if choice.problem is not None:
        raise ConfigError(
            "logger",
            f"{choice.problem}.",
            f"use one of: {', '.join('logger=' + n for n in logger_table.LOGGERS)}, or several at once:"
            " logger=[tensorboard,mlflow].",
        )
    for name in choice.trackers:
        tracker = logger_table.TRACKERS[name]
        if importlib.util.find_spec(tracker.module) is None:
            raise ConfigError(
                "logger",
                f"logger={name} needs the {tracker.module} package, which this Python environment does not have.",
                f"{tracker.pip} in the environment the job runs in, or use logger=jsonl.",
            )
    if "mlflow" in choice.trackers:
        check_mlflow_uri(cfg.select("logger.tracking_uri", default=None))


def check_mlflow_uri(uri: object) -> None:
    """MLflow 3 refuses its file store (./mlruns) unless MLFLOW_ALLOW_FILE_STORE=true: say so here, not at step 10."""
    if uri is None or os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() == "true":
        return
    text = str(uri)
    scheme = text.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) else ""
    if scheme in ("", "file"):
        raise ConfigError(
            "logger.tracking_uri",
            f'{text} is an MLflow file store, which MLflow 3 refuses ("maintenance mode") unless'
            " MLFLOW_ALLOW_FILE_STORE=true.",
            "use logger.tracking_uri=null (an SQLite store in each run dir), sqlite:////abs/path/mlflow.db or an"
            " http:// tracking server, or export MLFLOW_ALLOW_FILE_STORE=true.",
        )


def check_output_dir(run_dir: Path, key: str = "hydra.run.dir") -> None:
    probe = Path(run_dir).absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        reason = "is a file, not a folder" if not probe.is_dir() else "is not writable"
        raise ConfigError(
            key,
            f"the output directory {run_dir} cannot be created ({probe} {reason}).",
            f"pass {key}=/a/writable/path (e.g. on $SCRATCH or $WORK).",
        )


def script_cwd(cfg: ConfigView) -> Path:
    """Where the script runs: script.cwd, else the directory hpc-train was started in (as sbatch does)."""
    return Path(str(cfg.script.get("cwd") or os.getcwd())).expanduser().absolute()


def check_script(cfg: ConfigView, parallel: Parallelism) -> None:
    """The script exists (or its module imports) here, before anything is queued; its launcher fits the layout."""
    argv = [str(a) for a in cfg.script.argv]
    cwd = script_cwd(cfg)
    if not cwd.is_dir():
        raise ConfigError("script.cwd", f"{cwd} is not a directory.", "set script.cwd to the script's project folder.")
    if argv[0] == "-m":
        if len(argv) < 2 or not argv[1]:
            raise ConfigError(
                "script.argv", "`-m` names no module.", "write the module after -m: hpc-train ... -- -m package.module"
            )
        problem = _module_problem(argv[1], cwd)
        if problem:
            raise ConfigError(
                "script.argv",
                f"the module {argv[1]} does not import on this Python ({problem}), so no rank could run it.",
                f"install it here (pip install -e your project) or run hpc-train from the folder that holds it"
                f" (script.cwd, now {cwd}).",
            )
    else:
        path = Path(argv[0]).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.is_file():
            raise ConfigError(
                "script.argv",
                f"the script {argv[0]} does not exist in {cwd} (script.cwd).",
                "give a Python file that exists, relative to the directory hpc-train is started in (or script.cwd),"
                " e.g. hpc-train ... -- train.py ARGS, or -- -m package.module ARGS.",
            )
    if parallel.layout.max_nodes is not None:
        raise ConfigError(
            "resources.nodes",
            f"a script job runs on a fixed number of nodes, but resources.nodes={parallel.layout.nodes_text} lets"
            " Slurm choose one (a range is for hpc-train's own trainer, whose checkpoints resume at any node count).",
            f"set resources.nodes=N, e.g. resources.nodes={parallel.layout.nodes}.",
        )
    launcher = str(cfg.script.launcher)
    if launcher == "torchrun" and parallel.layout.strategy not in ("ddp", "fsdp", "mesh"):
        raise ConfigError(
            "script.launcher",
            f"script.launcher=torchrun starts one process per GPU of a node, but {parallel.kind.spelling}"
            " lays out one task with all of a node's GPUs for a script that uses them itself.",
            "use strategy=ddp (or fsdp, mesh) with script.launcher=torchrun, or script.launcher=direct.",
        )


def _module_problem(name: str, cwd: Path) -> Optional[str]:
    """Why `name` cannot be imported from `cwd` with this Python (None: it can)."""
    sys.path.insert(0, str(cwd))
    try:
        return None if importlib.util.find_spec(name) is not None else "no such module"
    except Exception as err:  # a parent package that fails to import
        return f"{type(err).__name__}: {err}"
    finally:
        sys.path.remove(str(cwd))


def check_container_keys(cfg: ConfigView, parallel: Parallelism, run_dir: Path) -> None:
    """The image and its mounts, against the layout, the run dir and the submitting dir
    (hpc_train.containers.checks)."""
    settings = ContainerSettings.from_section(plain(cfg.get("container")))
    kind = launcher_kind(cfg.launcher.name)
    if kind.prepares_only and settings.enabled:  # the ranks start from the user's script: its srun, not ours
        raise ConfigError(
            "container",
            f"launcher={kind.name} only writes the job spec; your sbatch script's own srun line starts the ranks, and"
            f" it does not put them in the image of container.name={settings.name}.",
            "submit with launcher=slurm, whose srun line runs every rank in the image (`hpc-train launcher=slurm"
            " dry_run=true ...` prints it), or start the ranks in the image in your script and pass container=none.",
        )
    binds = [os.getcwd(), str(Path(run_dir).absolute().parent)]
    check_container(settings, binds, kind.on_this_machine, tasks_per_node=parallel.layout.tasks_per_node)


def validate(cfg: ConfigView, parallel: Parallelism, run_dir: Path) -> None:
    """Run every launch-side check that needs the layout (after check_keys); the first failure raises ConfigError."""
    check_container_keys(cfg, parallel, run_dir)
    check_replica_groups(cfg, parallel)  # before a script job's return: a script job with replica groups is refused
    if is_script_job(cfg):  # the strategy picks the layout only: the trainer's keys do not apply
        check_script(cfg, parallel)
        check_script_profile(cfg)
        check_output_dir(run_dir)
        return
    check_timeouts(cfg)
    check_layout(cfg, parallel, run_dir=run_dir)
    check_data(cfg)
    check_targets(cfg)
    check_resume(cfg)
    check_logger(cfg)
    check_objective(cfg)
    check_output_dir(run_dir)


def check_layout(
    cfg: ConfigView, parallel: Parallelism, every: Sequence[Parallelism] = (), run_dir: Optional[Path] = None
) -> None:
    """The cross-key checks that read the layout; a range of nodes runs them at every count, `every` being each
    count's parallelism (parallelism.resolve_node_range); `run_dir`: where a checkpoint the run continues is found."""
    if is_script_job(cfg):  # the strategy picks the layout only: the trainer's keys do not apply
        return
    check_strategy(cfg, parallel)
    check_activation_checkpointing(cfg, parallel)
    check_trainer(cfg, parallel, every, run_dir)
    check_profile_ranks(cfg, max(p.layout.world_size for p in (parallel, *every)))


def check_script_profile(cfg: ConfigView) -> None:
    """trainer.profile on a script job would silently write nothing: hpc_train does not run the script's steps."""
    if cfg.trainer.profile.steps is not None:
        raise ConfigError(
            "trainer.profile.steps",
            "a script job runs your script, not hpc_train's training loop, so hpc_train cannot profile its steps.",
            "profile inside the script with torch.profiler, writing to $HPC_TRAIN_RUN_DIR/profile (the results guide,"
            " Performance, shows how), and leave trainer.profile.steps=null.",
        )


def check_profile_ranks(cfg: ConfigView, world_size: int) -> None:
    """A rank trainer.profile.ranks names must exist (at the largest node count of a range)."""
    ranks = cfg.trainer.profile.ranks
    if cfg.trainer.profile.steps is None or ranks == "all":
        return
    missing = sorted(int(rank) for rank in ranks if int(rank) >= world_size)
    if missing:
        raise ConfigError(
            "trainer.profile.ranks",
            f"names rank {', '.join(map(str, missing))}, but this job has {world_size} rank"
            f"{'s' if world_size != 1 else ''} (0 to {world_size - 1}).",
            f"choose ranks below {world_size}, e.g. trainer.profile.ranks=[0], or trainer.profile.ranks=all.",
        )


def check_resume_compatible(spec: dict, run_dir: Path) -> None:
    """Refuse, before queueing, to resume from a checkpoint written with settings that must match."""
    resume = str(spec.get("resume", "auto"))
    target = rundir.newest_checkpoint(resume, Path(run_dir))
    if target is None:
        return
    saved = read_header_fingerprint(target)
    if saved is None:
        return  # unreadable here: the ranks verify it and fall back to an older one
    kind = KINDS[str(spec["job"]["layout"]["strategy"])]
    world = int(spec["job"]["layout"]["world_size"])
    changed = differences(saved, fingerprint(spec, world, sharded=kind.sharded, any_world=kind.any_world))
    if changed:
        raise ConfigError(
            "resume",
            f"the checkpoint {target} was written by a run with other settings ({'; '.join(changed)}), so this run"
            " cannot continue it.",
            "run with the checkpoint's settings, or start over with resume=never (old checkpoints are moved aside) or a"
            " new hydra.run.dir.",
        )
