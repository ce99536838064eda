"""Hydra's standard doors: its flags, users' config dirs, hydra/ groups and its real plugins.

Every command runs the real `hpc-train` entry point in a subprocess; the sweeper and launcher
plugins are the real hydra-optuna-sweeper, hydra-joblib-launcher and hydra-submitit-launcher
packages (installed by the test extra).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.cli import TINY, assert_ok, run_cli

ONE_EPOCH = [*TINY, "trainer.epochs=1", "data.num_samples=256"]


def _yaml(text: str):
    return yaml.safe_load(text)


# -- flags, in both spellings ------------------------------------------------------------------
@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--cfg=job"], ["-c", "job"]])
def test_cfg_job_prints_the_composed_job_config(flag):
    proc = run_cli([*flag, "strategy=single", "trainer.lr=0.125"])
    assert_ok(proc)
    cfg = _yaml(proc.stdout)
    assert cfg["strategy"]["name"] == "single" and cfg["trainer"]["lr"] == 0.125
    assert "hydra" not in cfg


@pytest.mark.parametrize("flag", [["--cfg", "hydra"], ["--cfg=hydra"]])
def test_cfg_hydra_prints_hydra_config_with_our_launcher_and_sweeper(flag):
    proc = run_cli(flag)
    assert_ok(proc)
    hydra_cfg = _yaml(proc.stdout)["hydra"]
    assert hydra_cfg["launcher"]["_target_"].endswith("HpcTrainLauncher")
    assert hydra_cfg["sweeper"]["_target_"].endswith("HpcTrainSweeper")


@pytest.mark.parametrize("flag", [["--cfg", "all"], ["--cfg=all"]])
def test_cfg_all_prints_both(flag):
    proc = run_cli(flag)
    assert_ok(proc)
    cfg = _yaml(proc.stdout)
    assert {"hydra", "strategy", "trainer", "objective"} <= set(cfg)


@pytest.mark.parametrize("flag", [["-p", "trainer"], ["--package=trainer"], ["--package", "trainer"]])
def test_package_flag_selects_one_node_and_resolve_resolves(flag):
    proc = run_cli(["--cfg", "job", *flag, "--resolve", "trainer.batch_size=48"])
    assert_ok(proc)
    assert proc.stdout.startswith("# @package trainer")
    assert _yaml(proc.stdout)["batch_size"] == 48


def test_info_defaults_lists_the_defaults_tree():
    proc = run_cli(["--info", "defaults", "model=toy_mlp"])
    assert_ok(proc)
    assert (
        "Defaults List" in proc.stdout and "model/toy_mlp" in proc.stdout and "hydra/sweeper/hpc_train" in proc.stdout
    )


def test_shell_completion_install_prints_hydras_bash_script():
    proc = run_cli(["-sc", "install=bash"])
    assert_ok(proc)
    assert "hydra_bash_completion" in proc.stdout and "complete" in proc.stdout


def test_add_and_delete_overrides():
    proc = run_cli(["--cfg", "job", "+new.key=1", "~logger"])
    assert_ok(proc)
    cfg = _yaml(proc.stdout)
    assert cfg["new"] == {"key": 1} and "logger" not in cfg


def test_deleting_a_required_key_is_refused_without_traceback(tmp_path):
    proc = run_cli([*TINY, "~trainer.lr"], tmp_path / "run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert "`trainer.lr`" in message and "Fix:" in message and "\n" not in message, message
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "job_config.yaml").exists()


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        (["+seed=3"], "seed", "seed=<value>"),
        (["+hydra/sweeper=optuna"], "hydra/sweeper", "hydra/sweeper=<option>"),
        (["hydra/sweeper=optunna"], "hydra/sweeper", "optuna"),
        (["~trainer.lrr"], "trainer.lrr", "check the spelling"),
        (["strategy=single,ddp"], "strategy", "-m"),
        (["objective=accuracy"], "objective", "eval_accuracy"),
        (["--config-dir", "/no/such/dir"], "--config-dir", "existing folder"),
        (["--config-name", "nope"], "--config-name", "--config-dir"),
        (
            ["-c", "job", "--info", "defaults"],
            "--cfg with --info",
            "at most one of --cfg, --info",
        ),  # Hydra: a traceback
        (["--resolve"], "--resolve", "--resolve only with --cfg"),
    ],
)
def test_hydra_errors_become_one_paragraph_with_key_and_fix(overrides, key, fix, tmp_path):
    proc = run_cli([*overrides, *TINY], tmp_path / "run")  # flags before overrides, as argparse wants
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert f"`{key}`" in message and "Fix:" in message and fix in message, message
    assert "\n" not in message and "Traceback" not in message


def test_hydra_job_logging_disabled_is_selectable(tmp_path):
    default_dir, quiet_dir = tmp_path / "default", tmp_path / "quiet"
    default_dir.mkdir(), quiet_dir.mkdir()  # a dry run removes a run dir it made itself; these it finds
    assert_ok(run_cli([*TINY, "dry_run=true"], default_dir))
    assert_ok(run_cli([*TINY, "dry_run=true", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"], quiet_dir))
    assert list(default_dir.glob("*.log")), "Hydra's default job logging writes <task>.log in the run dir"
    assert not list(quiet_dir.glob("*.log")), "hydra/job_logging=disabled writes no log file"


# -- a user's own config dir -------------------------------------------------------------------
def _user_conf(root: Path, gpus_per_node: int = 2) -> Path:
    conf = root / "my_conf"
    (conf / "cluster").mkdir(parents=True)
    (conf / "cluster" / "mysite.yaml").write_text(
        "defaults:\n  - slurm\n  - _self_\n\nname: mysite\npartition: gpu_p2\ncpus_per_gpu: 1\ngpus_per_node: "
        f"{gpus_per_node}\ntime: '00:05:00'\n"
    )
    return conf


@pytest.mark.parametrize("spelling", ["space", "equals", "short"])
def test_user_cluster_profile_inherits_the_shipped_one(spelling, tmp_path):
    conf = _user_conf(tmp_path)
    flag = {"space": ["--config-dir", str(conf)], "equals": [f"--config-dir={conf}"], "short": ["-cd", str(conf)]}[
        spelling
    ]
    proc = run_cli([*flag, *TINY, "launcher=slurm", "cluster=mysite", "dry_run=true"], tmp_path / "run")
    assert_ok(proc)
    sbatch = [line for line in proc.stdout.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition=gpu_p2" in sbatch and "#SBATCH --gres=gpu:2" in sbatch  # the user's keys
    assert "#SBATCH --time=5" in sbatch  # the user's time limit, in submitit's minutes
    assert any(line.startswith("#SBATCH --signal=B:USR2@") for line in sbatch)  # inherited behaviour


def test_user_option_is_listed_and_validated_like_a_shipped_one(tmp_path):
    conf = _user_conf(tmp_path, gpus_per_node=0)
    typo = run_cli(
        ["--config-dir", str(conf), *TINY, "launcher=slurm", "cluster=mysit", "dry_run=true"], tmp_path / "a"
    )
    assert typo.returncode == 2 and "did you mean 'mysite'?" in typo.stderr, typo.stderr
    bad = run_cli(
        ["--config-dir", str(conf), *TINY, "launcher=slurm", "cluster=mysite", "dry_run=true"], tmp_path / "b"
    )
    assert bad.returncode == 2 and "`cluster.gpus_per_node`" in bad.stderr and "Fix:" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_hydra_searchpath_adds_a_config_dir(tmp_path):
    conf = _user_conf(tmp_path)
    proc = run_cli(
        [
            *TINY,
            f"hydra.searchpath=[file://{conf}]",
            "launcher=slurm",
            "cluster=mysite",
            "--cfg",
            "job",
            "-p",
            "cluster",
        ]
    )
    assert_ok(proc)
    assert _yaml(proc.stdout)["partition"] == "gpu_p2"


# -- hydra/launcher choices ----------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["submitit_slurm", "submitit_local", "hpc_train_slurm", "hpc_train_local"])
def test_submitit_launchers_are_refused_in_one_line(launcher, tmp_path):
    proc = run_cli(
        ["-m", f"hydra/launcher={launcher}", *TINY, "strategy=single,ddp", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert "`hydra/launcher`" in message and "launcher=slurm" in message and "\n" not in message, message
    assert not list((tmp_path / "sweep").glob("*/summary.json"))


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_plain_hydra_launchers_run_every_job(launcher, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        ["-m", f"hydra/launcher={launcher}", *ONE_EPOCH, "strategy=single", "seed=1,2", f"hydra.sweep.dir={sweep}"]
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

    The seeded sampler draws both values in 3 trials. (Optuna 2.10's grid sampler raises when its
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


def test_a_dry_run_is_refused_under_a_sweeper_that_optimises(tmp_path):
    proc = run_cli([*_optuna(tmp_path / "sweep", "trainer.lr=interval(0.01,0.1)"), *TINY, "dry_run=true"])
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert "`dry_run`" in message and "\n" not in message, message


def test_config_path_and_name_pick_another_primary_config(tmp_path):
    """-cp/-cn: a user's own primary config that starts from the shipped one."""
    (tmp_path / "exp.yaml").write_text("defaults:\n  - config\n  - _self_\n\nseed: 42\n")
    proc = run_cli(
        ["-cp", str(tmp_path), "-cn", "exp", "hydra.searchpath=[pkg://hpc_train.conf]", "--cfg", "job", "-p", "seed"]
    )
    assert_ok(proc)
    assert proc.stdout.strip().splitlines()[-1] == "42"


def test_hydra_help_version_and_search_path_info(tmp_path):
    conf = _user_conf(tmp_path)
    assert run_cli(["--hydra-help"]).stdout.startswith("Hydra (")
    assert run_cli(["--version"]).stdout.startswith("Hydra ")
    info = run_cli(["--info", "searchpath", "--config-dir", str(conf)])
    assert_ok(info)
    assert f"file://{conf}" in info.stdout
