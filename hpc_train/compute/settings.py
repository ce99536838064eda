"""A rank's typed settings: each section of the completed job spec read once into a small frozen dataclass.

The login side completes the job spec (every declared key gets its default, hpc_train.config) and
writes it; a rank reads it at its start (hpc_train.compute.entry) into the settings each of its parts
takes: the trainer its loop's, the checkpointer the checkpointing's, the strategy its own, the
heartbeat the watchdog's. Each settings class sits beside the part that reads it and lists field
names only: what a key accepts, means and defaults to is declared once, in hpc_train.config, and
tests/unit/test_rank_settings.py holds every class's fields to those declarations. Nothing falls
back to a default here (save the ``backend`` section of a spec written before the launch side wrote
one, :func:`backend_section`): a declared key missing from a spec is an error naming it.

Values are taken as the spec carries them: a ``_target_`` node (the model, the datasets, a loss)
stays a config mapping, which is what Hydra's ``instantiate`` builds from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, List, Mapping, Type, TypeVar, get_type_hints

from hpc_train.config.launcher import launcher_kind
from hpc_train.contracts.job_layout import JobLayout

T = TypeVar("T")


def section(cls: Type[T], node: Mapping[str, Any]) -> T:
    """`cls` with each field read from `node`, a section of the completed job spec; a field typed with another
    settings class is read from the sub-section of its name. Keys `cls` does not name are not read."""
    types = get_type_hints(cls)
    return cls(
        **{
            f.name: section(types[f.name], node[f.name]) if is_dataclass(types[f.name]) else node[f.name]
            for f in fields(cls)  # type: ignore[arg-type]
        }
    )


@dataclass(frozen=True)
class JobSettings:
    """The ``job`` section the launch side adds to the spec (hpc_train.launch.planning.jobspec): where the run lives,
    its layout, the config-group options it was composed from, and the folders the user's code is imported from."""

    run_dir: str
    layout: JobLayout  # the record the launch side wrote (its world_size is the layout's own)
    choices: Mapping[str, str]
    code_dirs: List[str]


@dataclass(frozen=True)
class BackendSettings:
    """The ``backend`` section the launch side adds to the spec (hpc_train.config.launcher.LauncherKind.rank_settings):
    how the ranks were started. A rank chooses by these fields, never by the launcher's name. A spec written when the
    section also held ``name`` and ``requeue`` reads the same: keys no field names are not read."""

    slurm_job: bool  # the ranks run inside a Slurm job: a time limit, its stop signal, compute nodes without internet


def backend_section(spec: Mapping[str, Any]) -> BackendSettings:
    """The job spec's ``backend`` section, typed."""
    if "backend" in spec:
        return section(BackendSettings, spec["backend"])
    # A job_config.yaml written before the launch side wrote this section (a run dir resumed or requeued across the
    # upgrade) has none: the section its launcher writes today. The one place a rank reads the launcher's name.
    return section(BackendSettings, launcher_kind(spec["launcher"]["name"]).rank_settings())
