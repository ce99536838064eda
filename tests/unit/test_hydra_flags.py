"""Hydra's standard doors, answered by the `hpc-train` entry point called in this process (run_cli_in_process: no
process starts): its flags in both spellings, its errors reworded into one paragraph, users' config dirs, hydra/
groups, and the hydra/launcher choices refused before a sweep starts. The commands that start ranks or ask Slurm (the
plain launchers and the optuna sweeper running trials, a user's cluster profile in a Slurm dry run) and the same
answers from the command in its own process: tests/e2e/test_hydra_cli.py.
"""

from __future__ import annotations

import pytest
import yaml

from tests.support.cli import TINY, assert_ok, run_cli_in_process, user_cluster_conf


# -- flags, in both spellings ------------------------------------------------------------------
@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--cfg=job"], ["-c", "job"]])
def test_cfg_job_prints_the_composed_job_config(flag):
    proc = run_cli_in_process([*flag, "strategy=single", "trainer.lr=0.125"])
    assert_ok(proc)
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["strategy"]["name"] == "single" and cfg["trainer"]["lr"] == 0.125
    assert "hydra" not in cfg


@pytest.mark.parametrize("flag", [["--cfg", "hydra"], ["--cfg=hydra"]])
def test_cfg_hydra_prints_hydra_config_with_our_launcher_and_sweeper(flag):
    proc = run_cli_in_process(flag)
    assert_ok(proc)
    hydra_cfg = yaml.safe_load(proc.stdout)["hydra"]
    assert hydra_cfg["launcher"]["_target_"].endswith("HpcTrainLauncher")
    assert hydra_cfg["sweeper"]["_target_"].endswith("HpcTrainSweeper")


@pytest.mark.parametrize("flag", [["--cfg", "all"], ["--cfg=all"]])
def test_cfg_all_prints_both(flag):
    proc = run_cli_in_process(flag)
    assert_ok(proc)
    cfg = yaml.safe_load(proc.stdout)
    assert {"hydra", "strategy", "trainer", "objective"} <= set(cfg)


@pytest.mark.parametrize("flag", [["-p", "trainer"], ["--package=trainer"], ["--package", "trainer"]])
def test_package_flag_selects_one_node_and_resolve_resolves(flag):
    proc = run_cli_in_process(["--cfg", "job", *flag, "--resolve", "trainer.batch_size=48"])
    assert_ok(proc)
    assert proc.stdout.startswith("# @package trainer")
    assert yaml.safe_load(proc.stdout)["batch_size"] == 48


def test_info_defaults_lists_the_defaults_tree():
    proc = run_cli_in_process(["--info", "defaults", "model=toy_mlp"])
    assert_ok(proc)
    assert (
        "Defaults List" in proc.stdout and "model/toy_mlp" in proc.stdout and "hydra/sweeper/hpc_train" in proc.stdout
    )


def test_shell_completion_install_prints_hydras_bash_script():
    proc = run_cli_in_process(["-sc", "install=bash"])
    assert_ok(proc)
    assert "hydra_bash_completion" in proc.stdout and "complete" in proc.stdout


def test_add_and_delete_overrides():
    proc = run_cli_in_process(["--cfg", "job", "+new.key=1", "~logger"])
    assert_ok(proc)
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["new"] == {"key": 1} and "logger" not in cfg


def test_deleting_a_required_key_is_refused_without_traceback(tmp_path):
    proc = run_cli_in_process([*TINY, "~trainer.lr"], tmp_path / "run", refused=True)
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
    proc = run_cli_in_process(
        [*overrides, *TINY], tmp_path / "run", refused=True
    )  # flags before overrides, as argparse wants
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert f"`{key}`" in message and "Fix:" in message and fix in message, message
    assert "\n" not in message and "Traceback" not in message


def test_hydra_job_logging_disabled_is_selectable(tmp_path):
    default_dir, quiet_dir = tmp_path / "default", tmp_path / "quiet"
    default_dir.mkdir(), quiet_dir.mkdir()  # a dry run removes a run dir it made itself; these it finds
    assert_ok(run_cli_in_process([*TINY, "dry_run=true"], default_dir))
    assert_ok(
        run_cli_in_process(
            [*TINY, "dry_run=true", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"], quiet_dir
        )
    )
    assert list(default_dir.glob("*.log")), "Hydra's default job logging writes <task>.log in the run dir"
    assert not list(quiet_dir.glob("*.log")), "hydra/job_logging=disabled writes no log file"


def test_several_loggers_compose_into_one_node():
    """Hydra's list syntax for a config group merges the options; `trackers` keeps every one."""
    proc = run_cli_in_process(["--cfg", "job", "-p", "logger", "logger=[tensorboard,wandb,mlflow]"])
    assert_ok(proc)
    assert "trackers:\n  tensorboard: true\n  wandb: true\n  mlflow: true\n" in proc.stdout
    assert "log_dir: tensorboard" in proc.stdout and "tracking_uri: null" in proc.stdout and "mode: null" in proc.stdout


# -- a user's own config dir -------------------------------------------------------------------
def test_user_option_is_listed_and_validated_like_a_shipped_one(tmp_path):
    conf = user_cluster_conf(tmp_path, gpus_per_node=0)
    typo = run_cli_in_process(
        ["--config-dir", str(conf), *TINY, "launcher=slurm", "cluster=mysit", "dry_run=true"],
        tmp_path / "a",
        refused=True,
    )
    assert typo.returncode == 2 and "did you mean 'mysite'?" in typo.stderr, typo.stderr
    bad = run_cli_in_process(
        ["--config-dir", str(conf), *TINY, "launcher=slurm", "cluster=mysite", "dry_run=true"],
        tmp_path / "b",
        refused=True,
    )
    assert bad.returncode == 2 and "`cluster.gpus_per_node`" in bad.stderr and "Fix:" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_hydra_searchpath_adds_a_config_dir(tmp_path):
    conf = user_cluster_conf(tmp_path)
    proc = run_cli_in_process(
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
    assert yaml.safe_load(proc.stdout)["partition"] == "gpu_p2"


# -- hydra/launcher choices ----------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["submitit_slurm", "submitit_local", "hpc_train_slurm", "hpc_train_local"])
def test_submitit_launchers_are_refused_in_one_line(launcher, tmp_path):
    proc = run_cli_in_process(
        ["-m", f"hydra/launcher={launcher}", *TINY, "strategy=single,ddp", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        refused=True,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert "`hydra/launcher`" in message and "launcher=slurm" in message and "\n" not in message, message
    assert not list((tmp_path / "sweep").glob("*/summary.json"))


# -- a sweeper that optimises the returned objective ---------------------------------------------
def test_a_dry_run_is_refused_under_a_sweeper_that_optimises(tmp_path):
    optuna = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.sampler.seed=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = run_cli_in_process([*optuna, "trainer.lr=interval(0.01,0.1)", *TINY, "dry_run=true"])
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert "`dry_run`" in message and "\n" not in message, message


def test_config_path_and_name_pick_another_primary_config(tmp_path):
    """-cp/-cn: a user's own primary config that starts from the shipped one."""
    (tmp_path / "exp.yaml").write_text("defaults:\n  - config\n  - _self_\n\nseed: 42\n")
    proc = run_cli_in_process(
        ["-cp", str(tmp_path), "-cn", "exp", "hydra.searchpath=[pkg://hpc_train.conf]", "--cfg", "job", "-p", "seed"]
    )
    assert_ok(proc)
    assert proc.stdout.strip().splitlines()[-1] == "42"


def test_hydra_help_version_and_search_path_info(tmp_path):
    conf = user_cluster_conf(tmp_path)
    assert run_cli_in_process(["--hydra-help"]).stdout.startswith("Hydra (")
    assert run_cli_in_process(["--version"]).stdout.startswith("Hydra ")
    info = run_cli_in_process(["--info", "searchpath", "--config-dir", str(conf)])
    assert_ok(info)
    assert f"file://{conf}" in info.stdout
