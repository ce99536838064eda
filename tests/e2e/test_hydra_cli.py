"""Hydra's standard doors that start something: a user's cluster profile in a Slurm dry run (sinfo), the plain
launchers and the optuna sweeper running trials; and the command in its own process answering as it does called in
the test's process.

Every command runs the real `hpc-train` entry point in a subprocess; the sweeper and launcher
plugins are the real hydra-optuna-sweeper, hydra-joblib-launcher and hydra-submitit-launcher
packages (installed by the test extra). Hydra's flags, its errors reworded, users' config dirs refused and the
hydra/launcher refusals, called in-process: tests/unit/test_hydra_flags.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.cli import TINY, assert_ok, run_cli, run_cli_in_process, user_cluster_conf
from tests.support.warm_ranks import fresh_env

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

ONE_EPOCH = [*TINY, "trainer.epochs=1", "data.num_samples=256"]


def _yaml(text: str):
    return yaml.safe_load(text)


# -- a user's own config dir -------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["space", "equals", "short"])
def test_user_cluster_profile_inherits_the_shipped_one(spelling, tmp_path):
    conf = user_cluster_conf(tmp_path)
    flag = {"space": ["--config-dir", str(conf)], "equals": [f"--config-dir={conf}"], "short": ["-cd", str(conf)]}[
        spelling
    ]
    proc = run_cli([*flag, *TINY, "launcher=slurm", "cluster=mysite", "dry_run=true"], tmp_path / "run")
    assert_ok(proc)
    sbatch = [line for line in proc.stdout.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition=gpu_p2" in sbatch and "#SBATCH --gres=gpu:2" in sbatch  # the user's keys
    assert "#SBATCH --time=5" in sbatch  # the user's time limit, in submitit's minutes
    assert any(line.startswith("#SBATCH --signal=B:USR2@") for line in sbatch)  # inherited behaviour


# -- hydra/launcher choices ----------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_plain_hydra_launchers_run_every_job(launcher, tmp_path):
    sweep = tmp_path / "sweep"
    # joblib's workers set thread variables a library reads at import: the fork server would start those ranks fresh
    env = fresh_env() if launcher == "joblib" else None
    proc = run_cli(
        ["-m", f"hydra/launcher={launcher}", *ONE_EPOCH, "strategy=single", "seed=1,2", f"hydra.sweep.dir={sweep}"],
        env=env,
    )
    assert_ok(proc)
    seeds = sorted(_yaml((sweep / str(n) / "job_config.yaml").read_text())["seed"] for n in (0, 1))
    assert seeds == [1, 2]
    assert all((sweep / str(n) / "summary.json").exists() for n in (0, 1))


# -- a sweeper that optimises the returned objective ---------------------------------------------
def _optuna(sweep: Path, *extra: str) -> list:
    seeded = ["hydra.sweeper.sampler.seed=1"]
    return ["-m", "hydra/sweeper=optuna", *seeded, f"hydra.sweep.dir={sweep}", *extra]


def _eval_losses(sweep: Path) -> list:
    return [json.loads(p.read_text())["eval_loss"] for p in sorted(sweep.glob("*/summary.json"))]


def test_optuna_minimises_eval_loss_over_local_trials(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [*_optuna(sweep, "hydra.sweeper.n_trials=3", "trainer.lr=interval(0.01,0.3)"), *ONE_EPOCH, "strategy=single"],
        timeout=600,
    )
    assert_ok(proc)
    results = _yaml((sweep / "optimization_results.yaml").read_text())
    losses = _eval_losses(sweep)
    assert len(losses) == 3
    assert results["best_value"] == pytest.approx(min(losses), rel=1e-9)


def test_optuna_maximises_another_objective(tmp_path):
    sweep = tmp_path / "sweep"
    args = _optuna(
        sweep, "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize", "trainer.lr=interval(0.01,0.3)"
    )
    proc = run_cli([*args, *ONE_EPOCH, "strategy=single", "objective=eval_accuracy"], timeout=600)
    assert_ok(proc)
    accuracies = [json.loads(p.read_text())["eval_accuracy"] for p in sweep.glob("*/summary.json")]
    assert _yaml((sweep / "optimization_results.yaml").read_text())["best_value"] == pytest.approx(
        max(accuracies), rel=1e-9
    )


def test_a_trial_that_fails_validation_does_not_end_the_study(tmp_path):
    """Grid over a batch size that does not split over 2 DDP ranks (31) and one that does (32).

    The seeded sampler draws both values in 3 trials. (Optuna's grid sampler raises when its
    last point fails, so it is not used here.)
    """
    sweep = tmp_path / "sweep"
    args = _optuna(
        sweep,
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=1",
        "hydra.sweeper.max_failure_rate=1.0",
        "trainer.batch_size=choice(31,32)",
    )
    proc = run_cli([*args, *ONE_EPOCH, "strategy=ddp", "resources.gpus_per_node=2"], timeout=600)
    assert_ok(proc)
    assert "`trainer.batch_size`" in proc.stdout + proc.stderr
    results = _yaml((sweep / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"trainer.batch_size": 32}
    assert 1 <= len(_eval_losses(sweep)) < 3
    assert results["best_value"] == pytest.approx(min(_eval_losses(sweep)), rel=1e-9)


def test_a_null_objective_fails_the_trial_naming_objective(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [
            *_optuna(sweep, "hydra.sweeper.n_trials=1", "seed=choice(0,1)"),
            *ONE_EPOCH,
            "strategy=single",
            "trainer.eval=false",
        ],
        timeout=600,
    )
    assert proc.returncode != 0
    assert "`objective`" in proc.stderr and "eval_loss=None" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# -- the command in its own process ----------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["--cfg", "job", "strategy=single", "trainer.lr=0.125"],  # Hydra's flag: the config printed
        [*TINY, "trainer.epochs=0"],  # refused: hpc-train's paragraph, exit code 2
        ["--resolve", *TINY],  # Hydra's flag check, reworded
        ["--version"],  # argparse's own exit
        [*TINY, "strategy=ddp", "resources.gpus_per_node=2", "dry_run=true"],  # a dry run's plan
    ],
    ids=["cfg", "refused", "flag-check", "version", "dry-run"],
)
def test_the_command_in_its_own_process_answers_as_it_does_called_in_process(args, tmp_path):
    """tests/unit calls the entry point in the test's process (run_cli_in_process); the command as users start it, a
    new Python, gives the same exit code, stdout and stderr."""
    own = run_cli(args, tmp_path / "run")
    called = run_cli_in_process(args, tmp_path / "run", refused=own.returncode != 0)
    assert (called.returncode, called.stdout, called.stderr) == (own.returncode, own.stdout, own.stderr)
