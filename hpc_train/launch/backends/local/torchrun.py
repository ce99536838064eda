"""``torchrun ... -m hpc_train.cli ...``: the CLI as one rank of torchrun's world.

Without this, every process torchrun starts would run a whole local job of its own (and hang:
torchrun's agent-store variables leak into those jobs' workers). Under torchrun, recognised by
its own ``TORCHELASTIC_RUN_ID``, each process instead:

* uses one run dir shared by all ranks: ``hydra.run.dir`` when given, else
  ``outputs/torchrun-<run id>`` (the default ``outputs/${now:...}`` can differ between ranks
  started a second apart). A run id of ``none`` (torchrun without ``--standalone`` or
  ``--rdzv-id``) says nothing shared, so that case needs ``hydra.run.dir``;
* plans the job as ``hpc-train`` would and refuses when torchrun's world differs from the plan
  (``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` against the strategy's tasks);
* lets rank 0 alone write ``job_config.yaml`` and Hydra's ``.hydra/`` folder;
* trains in-process as its rank (``hpc_train.compute.worker``), the rendezvous from torchrun.

One node only (the local launcher's checks apply); sweeps (``-m``) are refused. Launch side:
no torch import here.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import List, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import launcher_kind
from hpc_train.launch.backends.run import report_summary
from hpc_train.launch.planning.jobspec import build_job_spec, write_job_spec
from hpc_train.launch.planning.plan import make_plan
from hpc_train.records import rundir

PEER_REFUSAL_WAIT_S = 60.0  # a non-zero local rank's wait for torchrun's SIGTERM after a refusal

MARKER = "TORCHELASTIC_RUN_ID"
RUN_DIR_PREFIX = "outputs/torchrun-"


def active(env: Optional[Mapping[str, str]] = None) -> bool:
    """True in a process started by torchrun."""
    return MARKER in (os.environ if env is None else env)


def _given(argv: List[str], key: str) -> bool:
    return any(re.match(rf"^\+{{0,2}}{re.escape(key)}=", arg) for arg in argv)


def rank_argv(argv: List[str], env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The command line this torchrun rank runs: one run dir for all ranks, Hydra's files by rank 0 only.

    Returns `argv` unchanged outside torchrun; raises ConfigError when torchrun gives nothing to
    derive a shared run dir from, or for a sweep.
    """
    env = os.environ if env is None else env
    if not active(env):
        return argv
    if any(arg in ("-m", "--multirun") for arg in argv):
        raise ConfigError(
            "-m",
            "a sweep cannot run under torchrun: every torchrun process would start the whole sweep.",
            "run the sweep with hpc-train -m directly (it starts every rank of every job itself).",
        )
    extra = []
    if not _given(argv, "hydra.run.dir"):
        run_id = env.get(MARKER, "").strip()
        if run_id in ("", "none"):
            _leave_the_reason_to_local_rank_0(env)
            raise ConfigError(
                "hydra.run.dir",
                "under torchrun without --standalone or --rdzv-id (its run id is 'none'), the ranks share nothing to"
                " name one run dir after, and the default outputs/<date>/<time> can differ between them.",
                "pass hydra.run.dir=outputs/my-run to every rank (torchrun ... -m hpc_train.cli ... hydra.run.dir=...),"
                " run torchrun --standalone or with --rdzv-id=<name>, or start the job with hpc-train directly (it"
                " starts the ranks itself).",
            )
        extra.append(f"hydra.run.dir={RUN_DIR_PREFIX}{re.sub(r'[^A-Za-z0-9._-]', '_', run_id)}")
    if env.get("RANK", "0") != "0" and not _given(argv, "hydra.output_subdir"):
        extra.append("hydra.output_subdir=null")  # .hydra/ is written by rank 0 only
    return [*argv, *extra]


def check_world(layout, env: Mapping[str, str]) -> None:
    """Refuse a torchrun world that is not the one the strategy plans (naming both sides' knobs)."""
    world, local = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    if world == layout.world_size and local == layout.tasks_per_node:
        return
    raise ConfigError(
        "resources.gpus_per_node",
        f"torchrun started {world} process(es) ({local} on this node, --nproc_per_node), but the job's layout needs "
        f"{layout.world_size} rank(s), {layout.tasks_per_node} per node ({layout.describe()}).",
        f"start torchrun with --nproc_per_node={layout.tasks_per_node}, or set resources.gpus_per_node to match"
        " --nproc_per_node (ddp: one rank per GPU; single, dp, model_parallel and pipeline: one process), or run"
        " hpc-train directly.",
    )


def run_rank(cfg: DictConfig, run_dir: Path, env: Optional[Mapping[str, str]] = None) -> int:
    """Plan the job, then train as this torchrun rank; returns the exit code. Raises ConfigError for bad input."""
    env = os.environ if env is None else env
    try:
        return _run_rank(cfg, run_dir, env)
    except ConfigError:
        _leave_the_reason_to_local_rank_0(env)
        raise


def _leave_the_reason_to_local_rank_0(env: Mapping[str, str]) -> None:
    """On a refusal every rank refuses alike, and local rank 0 alone says why (once per node).

    Returns on local rank 0. The other ranks wait for torchrun to stop them once rank 0 has failed:
    exiting first, they would make torchrun stop rank 0 before it printed the reason.
    """
    if env.get("LOCAL_RANK", "0") == "0":
        return
    time.sleep(PEER_REFUSAL_WAIT_S)
    raise SystemExit(rundir.EXIT_REFUSED)


def _run_rank(cfg: DictConfig, run_dir: Path, env: Mapping[str, str]) -> int:
    if not launcher_kind(cfg.launcher.name).on_this_machine:
        raise ConfigError(
            "launcher",
            f"launcher={cfg.launcher.name} under torchrun: torchrun already started this rank on this machine.",
            "drop the launcher override to train in torchrun's world, or run hpc-train launcher=slurm directly (not"
            " under torchrun).",
        )
    if int(env.get("GROUP_WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "resources.nodes",
            "hpc-train under torchrun runs on one node (torchrun --nnodes=1).",
            "for several nodes use hpc-train launcher=slurm resources.nodes=N, which starts every rank with srun.",
        )
    plan = make_plan(cfg, run_dir)
    check_world(plan.layout, env)
    is_main = env.get("RANK", "0") == "0"
    if cfg.dry_run:
        if is_main:
            print(f"hpc-train (dry run, under torchrun): {plan.layout.describe()}")
            print(f"  run dir: {run_dir}")
        return 0
    spec = build_job_spec(plan)
    if is_main:
        write_job_spec(spec, run_dir)
        print(f"hpc-train: {plan.layout.describe()} (under torchrun, run id {env.get(MARKER)})")
        print(f"hpc-train: run dir {run_dir}")
    from hpc_train.compute.worker import exit_now, run_spec  # torch: only a rank that trains imports it

    code = run_spec(OmegaConf.create(spec))
    if code == 1:
        exit_now(code)  # a failed rank leaves at once (see exit_now), its traceback already printed
    if is_main:
        report_summary(run_dir, code)
    sys.stdout.flush()
    return code
