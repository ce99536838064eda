"""Check a composed config before anything runs or is queued.

Each check raises ConfigError naming the key and the fix. ``check_keys`` first checks every
key's type and range against the table in ``schema.py`` (before the layout is computed);
``validate`` then checks what the types alone do not say (keys that must agree with each
other or with the layout, files, packages). Only cheap, local checks live here (no torch, no
network); cluster-side checks (partition names, node capacity) live with the Slurm launcher.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from hpc_train import rundir
from hpc_train.launch.errors import ConfigError
from hpc_train.launch.layout import JobLayout
from hpc_train.strategy_table import KINDS, fsdp_mesh, split_settings
from hpc_train.launch.objective import check_objective

RESUME_WORDS = ("auto", "never")
LOGGERS = ("jsonl", "tensorboard")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}


def normalize_precision(value: object) -> str:
    return str(value).lower()


def resolved_stages(cfg: DictConfig, layout: JobLayout) -> Optional[int]:
    """The stages a split strategy runs: as declared, else one per GPU of a task (of a node for `pipelining`)."""
    if not KINDS[layout.strategy].staged:
        return None
    declared = split_settings(cfg.strategy).stages
    if declared:
        return declared
    return layout.gpus_per_node if layout.strategy == "pipelining" else layout.gpus_per_task


def data_parallel_size(cfg: DictConfig, layout: JobLayout) -> int:
    """How many ranks split each global batch (pipelining-engine stages share one shard)."""
    if layout.strategy == "pipelining":
        return max(1, layout.world_size // resolved_stages(cfg, layout))
    return layout.world_size


def check_trainer(cfg: DictConfig, layout: JobLayout) -> None:
    """What the types alone do not say: training stops, and the global batch splits evenly."""
    trainer = cfg.trainer
    if trainer.epochs is None and trainer.max_steps is None:
        raise ConfigError(
            "trainer.epochs",
            "both trainer.epochs and trainer.max_steps are null, so training would never stop.",
            "set trainer.epochs=5 or trainer.max_steps=1000.",
        )
    batch = trainer.batch_size
    replicas = data_parallel_size(cfg, layout)
    chunks = split_settings(cfg.strategy).chunks or 1 if KINDS[layout.strategy].staged else 1
    divisor = replicas * chunks
    if batch % divisor != 0:
        what = f"world size {replicas}" if chunks == 1 else f"data-parallel size {replicas} x strategy.chunks={chunks}"
        suggestion = max(divisor, (batch // divisor) * divisor)
        raise ConfigError(
            "trainer.batch_size",
            f"the global batch {batch} does not split evenly over the {what} ({layout.describe()}).",
            f"use a multiple of {divisor}, e.g. trainer.batch_size={suggestion}.",
        )


def check_split_points(strategy: DictConfig) -> None:
    """split_points fix the stages; a strategy.stages or strategy.balance that says otherwise is refused."""
    settings = split_settings(strategy)
    points = settings.split_points
    if not points:
        return
    if len(set(points)) != len(points):
        raise ConfigError(
            "strategy.split_points", f"{points} names a module twice.", "name each module where a stage begins once."
        )
    stages = strategy.get("stages")
    if stages is not None and stages != len(points) + 1:
        raise ConfigError(
            "strategy.stages",
            f"is {stages}, but strategy.split_points={points} makes {len(points) + 1} stages.",
            f"drop strategy.stages (null) or set strategy.stages={len(points) + 1}.",
        )
    if settings.balance != "params":
        raise ConfigError(
            "strategy.balance",
            f"is {settings.balance!r}, but strategy.split_points already fixes where the stages begin.",
            "drop strategy.balance (params, the default, is ignored with split points), or drop strategy.split_points.",
        )


def check_mesh(strategy: DictConfig, nodes: int, tasks_per_node: int) -> Tuple[int, int]:
    """fsdp's (replicas, shards): strategy.replicate must split the W ranks into equal replicas."""
    world = nodes * tasks_per_node
    replicate = strategy.get("replicate", 1)
    replicas, shards = fsdp_mesh(strategy, nodes, tasks_per_node)
    if replicas < 1 or world % replicas:
        raise ConfigError(
            "strategy.replicate",
            f"{replicate} replicas do not divide the {world} ranks ({nodes} node{'s' if nodes != 1 else ''} x {tasks_per_node} GPUs).",
            f"use strategy.replicate=nodes (HSDP: shard inside each node), 1 (shard over all ranks), or a divisor of"
            f" {world}.",
        )
    return replicas, shards


def check_activation_checkpointing(cfg: DictConfig, layout: JobLayout) -> None:
    """Recomputing blocks in the backward pass needs the whole model in one process."""
    mode = str(cfg.trainer.get("activation_checkpointing", "none") or "none")
    if mode != "none" and KINDS[layout.strategy].staged:
        raise ConfigError(
            "trainer.activation_checkpointing",
            f"{KINDS[layout.strategy].spelling} runs the model's stages itself; activation checkpointing wraps the"
            " blocks of a whole model.",
            "use it with strategy=single, dp, ddp or fsdp, or set trainer.activation_checkpointing=none.",
        )


def check_strategy(cfg: DictConfig, layout: JobLayout) -> None:
    """How the split strategies' stages, micro-batches and schedule fit the layout and the batch."""
    if not KINDS[layout.strategy].staged:
        return
    if cfg.trainer.get("step") is not None:
        raise ConfigError(
            "trainer.step",
            f"{KINDS[layout.strategy].spelling} cuts the model into stages and computes trainer.loss on the last"
            " stage's output, so it cannot run a step that calls the whole model (the model's own loss included).",
            "train with strategy=ddp (or single, dp), or set trainer.step=null and give the loss as trainer.loss on"
            " (input, target) pairs.",
        )
    check_split_points(cfg.strategy)
    settings = split_settings(cfg.strategy)
    stages = resolved_stages(cfg, layout)
    if layout.strategy == "pipelining":
        if normalize_precision(cfg.trainer.precision) == "16":
            raise ConfigError(
                "trainer.precision",
                "fp16 needs loss scaling, which the pipelining engine's schedules do not apply.",
                "use trainer.precision=bf16 (no scaler needed) or strategy.engine=native.",
            )
        if layout.world_size % stages:
            raise ConfigError(
                "strategy.stages",
                f"{layout.world_size} ranks cannot form pipelines of {stages} stages.",
                f"choose strategy.stages dividing {layout.world_size} (nodes x gpus_per_node).",
            )
        if settings.schedule == "1f1b" and (settings.chunks or 1) < stages:
            raise ConfigError(
                "strategy.chunks",
                f"the 1F1B schedule needs at least as many micro-batches as stages ({stages}).",
                f"set strategy.chunks={stages} or more, or strategy.schedule=gpipe.",
            )
    elif cfg.launcher.name != "local" and stages > layout.gpus_per_task:
        # Locally, stages may share a device on purpose (a laptop, a CPU); on a cluster the GPU
        # count is asked for, and fewer GPUs than stages means two stages time-share one GPU.
        raise ConfigError(
            "strategy.stages",
            f"{stages} stages on {layout.gpus_per_task} GPUs per task would put two stages on one GPU.",
            f"set resources.gpus_per_node={stages}, or strategy.stages={layout.gpus_per_task} (null: one stage per"
            " GPU).",
        )
    # How many layers a model has is known only once it is built: the job checks that (and the
    # split points' names) at its start, before any training.
    if not isinstance(settings.balance, str) and len(settings.balance) != stages:
        raise ConfigError(
            "strategy.balance",
            f"{settings.balance} must list {stages} positive layer counts, one per stage.",
            f"give {stages} positive numbers (layers per stage), or use strategy.balance=params.",
        )
    per_rank = cfg.trainer.batch_size // data_parallel_size(cfg, layout)
    if settings.chunks and per_rank < settings.chunks:
        raise ConfigError(
            "strategy.chunks",
            f"{settings.chunks} micro-batches is more than the per-rank batch of {per_rank} samples.",
            f"use strategy.chunks<={per_rank} or raise trainer.batch_size.",
        )


IMAGE_FOLDER_TARGET = "hpc_train.compute.datasets.image_folder"


def check_data(cfg: DictConfig) -> None:
    data = cfg.data
    if data.train._target_ == IMAGE_FOLDER_TARGET:
        _check_image_folder(data)


def _check_image_folder(data: DictConfig) -> None:
    """data=imagefolder: the folders exist, hold images, and as many classes as data.num_classes says."""
    if OmegaConf.is_missing(data, "root") or not data.get("root"):
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
    if OmegaConf.is_missing(data, "num_classes"):
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
    """(key, dotted path) of every _target_ in the config, hydra's own node aside."""
    found: List[Tuple[str, str]] = []
    if isinstance(node, DictConfig):
        for key in node.keys():
            if path == "" and key == "hydra":
                continue
            child_path = f"{path}.{key}" if path else str(key)
            if key == "_target_":
                value = node._get_node(key)._value()
                if isinstance(value, str):
                    found.append((path or "_target_", value))
            else:
                found.extend(_targets(node._get_node(key), child_path))
    return found


def check_targets(cfg: DictConfig) -> None:
    """Every _target_'s top-level package is findable (find_spec imports nothing: no torch here)."""
    search = code_dirs() + sys.path
    for key, target in _targets(cfg, ""):
        top = target.split(".")[0]
        if (
            not top
            or importlib.machinery.PathFinder.find_spec(top, search) is None
            and importlib.util.find_spec(top) is None
        ):
            raise ConfigError(
                f"{key}._target_",
                f"{target!r}: no module {top!r} can be found from {os.getcwd()} or PYTHONPATH in this Python"
                " environment.",
                f"run hpc-train from the folder that holds {top}/ (or {top}.py), add its parent folder to PYTHONPATH,"
                " or pip install -e your package; the job imports it from the same places.",
            )


def check_resume(cfg: DictConfig) -> None:
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


def check_logger(cfg: DictConfig) -> None:
    """logger=tensorboard needs the tensorboard package: say so before anything is queued (without importing it)."""
    name = OmegaConf.select(cfg, "logger.name", default="jsonl")  # no logger node (~logger): jsonl
    if not isinstance(name, str) or name not in LOGGERS:
        raise ConfigError(
            "logger", f"unknown logger {name!r}.", f"use one of: {', '.join('logger=' + n for n in LOGGERS)}."
        )
    if name == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "logger",
            "logger=tensorboard needs the tensorboard package, which this Python environment does not have.",
            "pip install 'hpc-train[tensorboard]' (or pip install tensorboard) in the environment the job runs in, or"
            " use logger=jsonl.",
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


def validate(cfg: DictConfig, layout: JobLayout, run_dir: Path) -> None:
    """Run every launch-side check that needs the layout (after check_keys); the first failure raises ConfigError."""
    check_strategy(cfg, layout)
    check_activation_checkpointing(cfg, layout)
    check_trainer(cfg, layout)
    check_data(cfg)
    check_targets(cfg)
    check_resume(cfg)
    check_logger(cfg)
    check_objective(cfg)
    check_output_dir(run_dir)


def check_resume_compatible(spec: dict, run_dir: Path) -> None:
    """Refuse, before queueing, to resume from a checkpoint written with settings that must match."""
    from hpc_train.fingerprint import differences, fingerprint, read_header_fingerprint

    resume = str(spec.get("resume", "auto"))
    target = rundir.newest_checkpoint(resume, Path(run_dir))
    if target is None:
        return
    saved = read_header_fingerprint(target)
    if saved is None:
        return  # unreadable here: the ranks verify it and fall back to an older one
    sharded = KINDS[str(spec["job"]["layout"]["strategy"])].sharded
    changed = differences(saved, fingerprint(spec, int(spec["job"]["layout"]["world_size"]), sharded=sharded))
    if changed:
        raise ConfigError(
            "resume",
            f"the checkpoint {target} was written by a run with other settings ({'; '.join(changed)}), so this run"
            " cannot continue it.",
            "run with the checkpoint's settings, or start over with resume=never (old checkpoints are moved aside) or a"
            " new hydra.run.dir.",
        )
