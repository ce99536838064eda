"""What each job of a Hydra app's sweep runs: the app's task function on the job's own composed config, as
Hydra's own ``run_job`` runs it, with what every job of a launch shares pickled once."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from omegaconf import open_dict

from hpc_train.records import rundir

RETURN_FILE = "{job_id}_hydra_return.pkl"  # beside submitit's own files: a failed job's JobReturn


class SharedPart:
    """What every job of a launch shares (Hydra's context, the task function, the primary config, the singletons),
    pickled once into the sweep dir: submitit pickles each job on its own, and a 1,100-job sweep would otherwise
    write all of it 1,100 times (~70 kB a job)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def write(cls, path: Path, **parts: Any) -> "SharedPart":
        path.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_bytes_atomic(cloudpickle.dumps(parts), path)
        return cls(path)

    def read(self) -> Dict[str, Any]:
        return pickle.loads(self.path.read_bytes())


class AppTask:
    """What each job runs: the app's task function on the job's own composed config (pickled by submitit)."""

    def __init__(self, shared: SharedPart, overrides: List[str], job_num: int) -> None:
        self.shared, self.overrides, self.job_num = shared, overrides, job_num

    def __call__(self) -> JobReturn:
        import submitit  # submitit (~50 ms): every Hydra app imports this module (our plugin), whatever its launcher

        environment = submitit.JobEnvironment()
        ret = self.run(environment.job_id)
        if ret.status == JobStatus.FAILED:  # keep the JobReturn for the sweeper, then fail the job itself
            path = Path(environment.paths.folder) / RETURN_FILE.format(job_id=environment.job_id)
            path.write_bytes(cloudpickle.dumps(ret))
            raise ret._return_value
        return ret

    def run(self, job_id: str) -> JobReturn:
        """The task function on the job's own config, as Hydra's run_job runs it, `job_id` as hydra.job.id (a
        submitit job's, or a packed run's: hpc_train.pack.app_step)."""
        parts = self.shared.read()
        hydra_context, task_function = parts["hydra_context"], parts["task_function"]
        Singleton.set_state(parts["singleton_state"])
        setup_globals()
        sweep_config = hydra_context.config_loader.load_sweep_config(parts["config"], self.overrides)
        with open_dict(sweep_config.hydra.job) as job:
            job.id = job_id
            job.num = self.job_num
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's preemption/timeout hook: run the same job again (within max_num_timeout)."""
        import submitit  # submitit (~50 ms): every Hydra app imports this module (our plugin), whatever its launcher

        return submitit.helpers.DelayedSubmission(self)


@dataclass
class AppJob:
    """One job of a launch, as the launcher hands it on: Hydra's number, its overrides, its own ``hydra.launcher``
    node (plain data) and what it runs."""

    num: int
    overrides: List[str]
    launcher: Dict[str, Any]
    task: AppTask
