"""A rank's typed settings (hpc_train.compute.settings) hold the declared keys of their sections that a rank reads.

The settings classes sit beside the parts that read them and list field names only; the declarations
(hpc_train.config) say what each key accepts and defaults to. These tests keep the two in step: a key
declared with a default or as required is a field of its section's settings unless it is listed here as the
login side's alone (or read from the spec itself), no field is undeclared nor listed so, and a completed spec of
every shipped option reads into them.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Dict, List, Set

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hpc_train.compute.checkpointing.checkpointer import CheckpointSettings
from hpc_train.compute.data.loaders import DataSettings
from hpc_train.compute.entry.script_job import ScriptJobSettings, ScriptSettings
from hpc_train.compute.parallel import strategy_class
from hpc_train.compute.performance.settings import ProfileSettings
from hpc_train.compute.runtime.heartbeat import WatchdogSettings
from hpc_train.compute.runtime.interrupts import LauncherSettings
from hpc_train.compute.settings import BackendSettings, JobSettings, section
from hpc_train.compute.training.loggers import logger_settings
from hpc_train.compute.training.optim import OptimSettings
from hpc_train.compute.training.settings import RunSettings, TrainerSettings, TrainingSettings
from hpc_train.compute.training.tracker_common import LoggerSettings
from hpc_train.conf import CONFIG_DIR
from hpc_train.config import declared, engine
from hpc_train.config.strategy import strategy_id
from hpc_train.contracts import strategy_table
from hpc_train.contracts.job_layout import JobLayout

# Each config section the ranks read -> the settings classes that read it, between them.
READERS = {
    "": (RunSettings,),  # the top-level keys
    "trainer": (TrainerSettings, OptimSettings, CheckpointSettings, WatchdogSettings),
    "launcher": (LauncherSettings,),
    "data": (DataSettings,),
    "script": (ScriptSettings,),
    "logger": (LoggerSettings,),
}
# Declared keys a spec may leave out (Rule.left_out) that a rank still reads, and the field that holds them:
# logger.trackers, with logger.name, is read through hpc_train.contracts.logger_table as the trackers chosen.
READ_THROUGH = {"logger": {"trackers"}}
# Keys a rank reads from the spec itself, not through a settings class: trainer.max_requeues, read once training has
# stopped (hpc_train.compute.worker, hpc_train.compute.entry.job), where no settings are left.
READ_FROM_THE_SPEC = {"trainer": {"max_requeues"}}
# Keys of a section that no rank reads, the login side's alone: the job's name and dry_run (the plan and the
# submission), the launcher's name, wait, master_port (the launch side turns it into the ranks' MASTER_PORT) and
# array_parallelism; launcher.pack.* (launcher=slurm only) says how the login node packs a sweep's runs into
# allocations (hpc_train.launch.backends.slurm.packed).
LOGIN_ONLY = {
    "": {"job_name", "dry_run"},
    "launcher": {"name", "wait", "master_port", "array_parallelism", "pack"},
}


def names(*classes: type) -> List[str]:
    return [f.name for cls in classes for f in fields(cls)]


def carried(section_name: str) -> Set[str]:
    """The keys of a section every completed spec has: required, or filled with their declared default."""
    return {
        rule.key.split(".")[1] if "." in rule.key else rule.key  # a nested key (launcher.pack.time): its node
        for rule in declared(section_name)
        if (rule.required or rule.has_default) and "*" not in rule.key
    }


@pytest.mark.parametrize("section_name", sorted(READERS), ids=lambda s: s or "top")
def test_each_key_of_a_section_is_read_by_its_settings_or_listed(section_name):
    read = names(*READERS[section_name])
    assert len(read) == len(set(read)), f"a key of {section_name or 'the top level'} is read by two settings"
    others = LOGIN_ONLY.get(section_name, set()) | READ_FROM_THE_SPEC.get(section_name, set())
    assert not set(read) & others, "a key listed as read elsewhere is read by a settings class too"
    assert set(read) | others == carried(section_name) | READ_THROUGH.get(section_name, set())


@pytest.mark.parametrize("identity", sorted(strategy_table.KINDS))
def test_each_strategy_reads_the_keys_declared_for_it(identity):
    declared_for = {
        rule.key.rpartition(".")[2]
        for rule in declared("strategy")
        if (rule.required or rule.has_default) and (not rule.only or identity in rule.only)
    }
    assert set(names(strategy_class(identity).settings_type)) == declared_for


def test_the_job_section_is_what_the_launch_side_writes():
    # launch/jobspec.py writes the layout (JobLayout, its data-parallel size set, and its world size) under job.layout
    assert set(names(JobLayout)) | {"world_size"} == set(LAYOUT)
    assert set(names(JobSettings)) == {"run_dir", "layout", "choices", "code_dirs"}


ALL_SETTINGS = [
    *(cls for classes in READERS.values() for cls in classes),
    *(strategy_class(identity).settings_type for identity in strategy_table.KINDS),
    JobSettings,
    BackendSettings,
    TrainingSettings,
    ScriptJobSettings,
    ProfileSettings,
]


@pytest.mark.parametrize("cls", ALL_SETTINGS, ids=lambda cls: cls.__name__)
def test_settings_are_frozen_and_have_no_defaults(cls):
    assert cls.__dataclass_params__.frozen
    defaults = [f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING]
    assert not defaults, "a default belongs in hpc_train/config"


LAYOUT = {
    "strategy": "ddp",
    "nodes": 1,
    "tasks_per_node": 2,
    "gpus_per_node": 2,
    "gpus_per_task": 1,
    "cpus_per_task": 1,
    "mesh": None,
    "max_nodes": None,
    "world_size": 2,
    "data_parallel_size": 2,
}
JOB = {"run_dir": "/tmp/run", "layout": LAYOUT, "choices": {"model": "toy_mlp"}, "code_dirs": [], "claim": "x"}


def completed(overrides: List[str]) -> Dict[str, Any]:
    """The job spec `hpc-train OVERRIDES` writes, without its run: composed, resolved, completed, plus a job section."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    plain = engine.resolved(cfg)
    engine.check_plain(plain)
    engine.complete(plain)
    plain["job"] = JOB
    return plain


SPECS = [
    ["strategy=single"],
    ["strategy=ddp"],
    ["strategy=dp"],
    ["strategy=fsdp"],
    ["strategy=model_parallel"],
    ["strategy=pipeline"],
    ["strategy=pipeline", "strategy.engine=pipelining"],
    ["strategy=hybrid"],
    ["logger=tensorboard"],
    ["logger=wandb", "launcher=slurm"],
    ["logger=[tensorboard,mlflow]", "launcher=sbatch"],
    ["~logger"],
]


@pytest.mark.parametrize("overrides", SPECS, ids=" ".join)
def test_a_completed_spec_reads_into_every_settings(overrides):
    spec = OmegaConf.create(completed(overrides))
    for section_name, classes in READERS.items():
        node = spec if not section_name else spec[section_name] if section_name in spec else None
        for cls in classes:
            if cls is not LoggerSettings:
                section(cls, node)
    identity = strategy_id(spec.strategy)
    strategy = section(strategy_class(identity).settings_type, spec.strategy)
    assert strategy.identity == identity
    layout = section(JobSettings, spec.job).layout
    assert layout == JobLayout(**{k: v for k, v in LAYOUT.items() if k != "world_size"})
    assert layout.world_size == LAYOUT["world_size"]
    logger = logger_settings(spec.logger if "logger" in spec else None)
    if "~logger" in overrides:
        assert logger is None
    else:
        assert logger is not None and set(logger.trackers) == set(spec.logger.trackers)


def test_a_missing_key_is_an_error_naming_it_not_a_default():
    node = {"checkpoint_every": 10, "async_checkpoint": True}
    with pytest.raises(KeyError, match="keep_checkpoints"):
        section(CheckpointSettings, node)
    assert section(CheckpointSettings, {**node, "keep_checkpoints": 2, "other": 1}) == CheckpointSettings(10, 2, True)
