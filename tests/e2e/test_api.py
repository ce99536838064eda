"""The public Python API (hpc_train.compose/run/submit/sweep, Job) with real processes on this machine
(on the Slurm test cluster: tests/slurm/test_api_on_slurm.py)."""

from __future__ import annotations

import time

import pytest
import yaml
from omegaconf import OmegaConf

import hpc_train
from hpc_train.processes.warm_ranks import FORK_SERVER_VARIABLE
from tests.support.cli import assert_ok, read_summary, run_cli
from tests.unit.test_api_without_a_job import JOB, cpu_here  # noqa: F401  (cpu_here: an autouse fixture)

# Ranks forked warm (tests/support/warm_ranks.py); the cancel test's job starts fresh ranks (its stop signal's way)
pytestmark = pytest.mark.usefixtures("warm_ranks")

SLURM = [
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
    "launcher.signal_delay_s=30",
    "resources.gpus_per_node=1",
]


# -- compose ----------------------------------------------------------------------------------
def test_compose_is_the_clis_resolved_job_config(tmp_path):
    overrides = ["strategy=single", "model=toy_mlp", "trainer.lr=0.3", "data=synthetic", "data.num_classes=4"]
    cfg = hpc_train.compose(overrides)
    assert cfg.strategy.name == "single" and cfg.trainer.lr == 0.3 and "hydra" not in cfg
    assert cfg.model.num_classes == 4 and not OmegaConf.is_interpolation(cfg.model, "num_classes")
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written
    proc = run_cli(["--cfg", "job", "--resolve", *overrides])
    assert_ok(proc)
    assert OmegaConf.to_container(cfg) == yaml.safe_load(proc.stdout)


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model=resnet19"], "model"),  # Hydra refuses it: raised before any process starts
        (
            ["strategy=ddp", "trainer.batch_size=63"],
            "trainer.batch_size",
        ),  # validation refuses it: the CLI's exit code 2
    ],
)
def test_bad_input_raises_config_error_with_the_clis_message(overrides, key, tmp_path):
    with pytest.raises(hpc_train.ConfigError) as err:
        hpc_train.run([*JOB, *overrides], run_dir=tmp_path / "api", quiet=True)
    assert err.value.key == key
    proc = run_cli([*JOB, *overrides], tmp_path / "cli")
    assert proc.returncode == 2 and err.value.message == proc.stderr.strip(), (err.value.message, proc.stderr)
    assert not (tmp_path / "api").exists()  # the dir made for the call is gone with what it printed: the error says it


@pytest.mark.parametrize(
    "call, bad, key",
    [
        (hpc_train.submit, ["strategy=ddp", "trainer.batch_size=63"], "trainer.batch_size"),  # the job's validation
        (hpc_train.sweep, ["objective=nope", "seed=0,1"], "objective"),  # the sweep's, before the sweeper starts
    ],
    ids=["submit", "sweep"],
)
def test_a_refused_submit_or_sweep_leaves_no_dir(call, bad, key, tmp_path):
    with pytest.raises(hpc_train.ConfigError) as err:
        call([*JOB, *bad])
    assert err.value.key == key
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))  # outputs/<date>/<time>, multirun/...: gone


REWORDED = """
from hpc_train.config import errors
errors.ConfigError.message = property(lambda self: f"refused {self.key!r}; because: {self.problem}; so: {self.fix}")
"""


def test_the_apis_errors_survive_a_change_of_the_clis_wording(tmp_path, monkeypatch, capsys):
    """The child CLI hands its refusal back as data (key, problem, fix), not as the line it prints: with every
    ConfigError printed in other words, the API still raises the same key, problem and fix."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(REWORDED)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    overrides = [*JOB, "strategy=ddp", "trainer.batch_size=63"]
    with pytest.raises(hpc_train.ConfigError) as err:
        hpc_train.run(overrides, run_dir=tmp_path / "api")
    printed = capsys.readouterr().err
    assert "refused 'trainer.batch_size'; because:" in printed  # the child spoke in the new words
    assert err.value.key == "trainer.batch_size" and err.value.fix and err.value.problem in printed


# -- run --------------------------------------------------------------------------------------
def test_run_returns_the_summary_with_the_clis_loss(tmp_path):
    summary = hpc_train.run(JOB, run_dir=tmp_path / "api", quiet=True)
    assert summary == read_summary(tmp_path / "api") and summary["global_step"] == 4
    assert "hpc-train: done: 4 steps" in (tmp_path / "api" / "hpc-train.out").read_text()
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "api").rglob("*") if p.is_file()}
    dry = hpc_train.run([*JOB, "dry_run=true"], run_dir=tmp_path / "api", quiet=True)
    assert dry["dry_run"] and f"run dir: {tmp_path / 'api'}" in dry["output"], dry["output"]
    # A dry run into the run's dir touches none of its files (hpc-train.out: the run's output, not the dry run's).
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "api").rglob("*") if p.is_file()} == files
    # A call refused into the run's dir leaves its files as they were (.hydra/, cli.log, hpc-train.out): none added.
    for call in (hpc_train.run, hpc_train.submit):
        with pytest.raises(hpc_train.ConfigError) as err:
            call([*JOB, "trainer.lr=-1"], run_dir=tmp_path / "api")
        assert err.value.key == "trainer.lr"
        assert {
            p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "api").rglob("*") if p.is_file()
        } == files
    assert sorted(p.name for p in (tmp_path / "api").iterdir() if p.name.startswith(".")) == [".hydra"]
    proc = run_cli(JOB, tmp_path / "cli")
    assert_ok(proc)
    assert summary["train_loss"] == read_summary(tmp_path / "cli")["train_loss"]


def test_dry_runs_print_the_script_and_leave_no_run_dir(tmp_path, capsys):
    first = hpc_train.run([*JOB, *SLURM, "dry_run=true"])
    assert first["dry_run"] and "#SBATCH --ntasks-per-node=1" in first["output"]
    assert "#SBATCH --ntasks-per-node=1" in capsys.readouterr().out  # echoed as hpc-train prints it
    assert str(tmp_path / "outputs") in first["run_dir"] and f"{first['run_dir']}/slurm/" in first["output"]
    given = hpc_train.run([*JOB, *SLURM, "dry_run=true"], run_dir=tmp_path / "mine", quiet=True)
    assert f"{tmp_path / 'mine'}/slurm/" in given["output"]
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))  # the dirs the job would have: none made


def test_submit_refuses_a_dry_run_and_leaves_nothing(tmp_path, capsys):
    """A dry run starts no job: submit() says to use run() for it, before any dir is made."""
    with pytest.raises(hpc_train.ConfigError) as err:
        hpc_train.submit([*JOB, *SLURM, "dry_run=true"])
    assert err.value.key == "dry_run" and "hpc_train.run(" in err.value.fix
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


def test_a_failing_job_raises_job_failed_naming_the_rank(monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_TRAIN_FAIL_AT", "0:2")
    with pytest.raises(hpc_train.JobFailed) as err:
        hpc_train.run(JOB, run_dir=tmp_path / "run", quiet=True)
    assert err.value.error.startswith("InjectedFailure: HPC_TRAIN_FAIL_AT=0:2") and "rank 0 failed first" in str(
        err.value
    )
    assert err.value.exit_code == 1
    # Two ranks: the one that raised is named, not its peer that lost the connection.
    job = hpc_train.submit([*JOB, "strategy=ddp"], run_dir=tmp_path / "ddp")
    with pytest.raises(hpc_train.JobFailed) as err:
        job.wait(timeout=120)
    assert err.value.error.startswith("InjectedFailure") and job.state() == "FAILED"


# -- submit -----------------------------------------------------------------------------------
def test_submit_returns_at_once_and_wait_returns_the_summary(monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_TRAIN_STEP_SLEEP", "0.5")  # 4 steps: at least 2 s of training
    job = hpc_train.submit(JOB, run_dir=tmp_path / "run")
    assert job.launcher == "local" and job.run_dir == tmp_path / "run"
    assert job.state() == "RUNNING" and job.summary() is None
    with pytest.raises(TimeoutError):
        job.wait(timeout=0.2)
    summary = job.wait(timeout=120)
    assert summary["global_step"] == 4 and summary == job.summary()
    assert job.state() == "COMPLETED"


def test_cancel_stops_a_local_job_after_a_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_TRAIN_STEP_SLEEP", "0.5")
    monkeypatch.delenv(FORK_SERVER_VARIABLE, raising=False)
    job = hpc_train.submit([*JOB, "trainer.max_steps=100"], run_dir=tmp_path / "run")
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "metrics.jsonl").exists() and time.monotonic() < deadline:  # training has begun
        time.sleep(0.2)
    job.cancel()
    with pytest.raises(hpc_train.JobFailed):
        job.wait(timeout=120)
    assert job.state() == "CANCELLED" and list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))


# -- sweep ------------------------------------------------------------------------------------
def test_a_dry_sweep_prints_its_jobs_and_leaves_no_sweep_dir(tmp_path, capsys):
    assert hpc_train.sweep([*JOB, *SLURM, "seed=0,1", "dry_run=true"]) == []  # multirun/<date>/<time>
    assert hpc_train.sweep([*JOB, "seed=0,1", "dry_run=true"], sweep_dir=tmp_path / "mine") == []
    printed = capsys.readouterr().out  # what hpc-train printed: the dry run's answer is shown, not kept
    assert "#1 " in printed and "seed=1" in printed and f"run dir: {tmp_path / 'mine' / '1'}" in printed, printed
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


def test_local_sweep_gives_one_job_per_run(tmp_path):
    jobs = hpc_train.sweep([*JOB, "seed=0,1"], sweep_dir=tmp_path / "sweep")
    assert [job.run_dir for job in jobs] == [tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"]
    assert [job.overrides[-1] for job in jobs] == ["seed=0", "seed=1"] and len({job.job_id for job in jobs}) == 2
    assert jobs[1].state() in ("PENDING", "RUNNING")  # one after another
    summaries = [job.wait(timeout=180) for job in jobs]
    assert [s["global_step"] for s in summaries] == [4, 4]
    assert [job.state() for job in jobs] == ["COMPLETED", "COMPLETED"]
