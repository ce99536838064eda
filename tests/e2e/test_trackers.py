"""logger=wandb, logger=mlflow and several loggers at once, against the real packages (no mocks).

W&B runs offline (compute nodes have no internet): the rows are read back from the run's
``offline-run-*/run-*.wandb`` file with W&B's own protobuf records. MLflow is read back through
its own client. A resumed run (kill -9 of the whole job past a checkpoint, then the same command
again) must continue the same W&B and MLflow runs, with the ids kept in the run dir.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.support.cli import (
    TINY,
    assert_ok,
    checkpoint_steps,
    kill_group,
    run_cli,
    run_python,
    start_background,
    wait_for,
)

TRAIN = [*TINY, "trainer.epochs=null", "trainer.batch_size=32", "strategy=single"]
RESUMED = [*TRAIN, "trainer.max_steps=20", "trainer.log_every=1", "trainer.checkpoint_every=4"]


def metrics(run_dir: Path, kind: str) -> List[Dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def last_step(run_dir: Path) -> int:
    try:
        return max((r["step"] for r in metrics(run_dir, "train")), default=0)
    except (OSError, ValueError):
        return 0


def kill9_past_a_checkpoint(args: List[str], run_dir: Path) -> int:
    """Start a run, kill -9 its whole process group once metrics.jsonl has step 10 (2 steps past the checkpoint of
    step 8: step 9 went to every tracker before step 10 was written); the step of the newest checkpoint left."""
    proc = start_background(args, run_dir, {"HPC_TRAIN_STEP_SLEEP": "0.3"})
    try:
        wait_for(lambda: last_step(run_dir) >= 10, 180, "step 10")
    finally:
        kill_group(proc)
    return checkpoint_steps(run_dir)[-1]


# -- reading W&B's offline files ------------------------------------------------------------------
def wandb_records(path: Path) -> Iterator[object]:
    """The protobuf records of a .wandb file: W&B's LevelDB-style log (a 7-byte header, then 32 KiB blocks of
    chunks: crc32 (4 bytes), length (2), type (1: full, 2: first, 3: middle, 4: last), data)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the next block
            pos += block - pos % block
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def wandb_run(folder: Path) -> Dict:
    """{"id", "config", "rows": {step: {key: value}}} of one offline-run-* folder."""
    (path,) = folder.glob("run-*.wandb")
    run: Dict = {"rows": {}}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["id"] = record.run.run_id
            run["project"] = record.run.project
            run["config"] = {u.key: json.loads(u.value_json) for u in record.run.config.update}
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            run["rows"].setdefault(record.history.step.num, {}).update(row)
    return run


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    kept = json.loads((run_dir / "mlflow_run.json").read_text())
    return MlflowClient(kept["tracking_uri"]), kept["run_id"]


def history(client, run_id: str, key: str) -> List:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# -- one local run, killed past a checkpoint and run again ------------------------------------------
@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """logger=[wandb,mlflow] (W&B offline): killed -9 past a checkpoint, then the same command again."""
    run_dir = tmp_path_factory.mktemp("trackers") / "run"
    args = [*RESUMED, "logger=[wandb,mlflow]", "logger.mode=offline", "logger.tags=[tiny,resumed]"]
    checkpoint = kill9_past_a_checkpoint(args, run_dir)
    first = {
        "wandb": json.loads((run_dir / "wandb_run.json").read_text()),
        "mlflow": json.loads((run_dir / "mlflow_run.json").read_text()),
        "last_step": last_step(run_dir),
    }
    client, run_id = mlflow_client(run_dir)
    first["mlflow_steps"] = [s for s, _ in history(client, run_id, "train_loss")]  # what the lost attempt logged
    proc = run_cli(args, run_dir)
    assert_ok(proc)
    return run_dir, checkpoint, first, proc


def test_wandb_offline_run_resumes_the_same_run_and_logs_metrics_jsonl_rows(resumed):
    run_dir, checkpoint, first, proc = resumed
    run_id = first["wandb"]["id"]
    assert json.loads((run_dir / "wandb_run.json").read_text())["id"] == run_id  # kept in the run dir, reused
    attempts = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(attempts) == 2 and not list((run_dir / "wandb").glob("run-*"))  # offline, one folder per attempt
    lost, last = wandb_run(attempts[0]), wandb_run(attempts[1])
    assert lost["id"] == last["id"] == run_id and last["project"] == "hpc-train"
    assert last["config"]["trainer"]["lr"] == 0.1 and last["config"]["logger"]["tags"] == ["tiny", "resumed"]
    train, evals = metrics(run_dir, "train"), metrics(run_dir, "eval")
    # The resumed attempt logged every row of metrics.jsonl past the checkpoint, with the same numbers.
    logged = {s: row["train/loss"] for s, row in last["rows"].items() if "train/loss" in row}
    assert logged == {r["step"]: r["loss"] for r in train if r["step"] > checkpoint}
    assert {s: row["eval/loss"] for s, row in last["rows"].items() if "eval/loss" in row} == {
        r["step"]: r["loss"] for r in evals if r["step"] > checkpoint
    }
    assert all(last["rows"][r["step"]]["train/lr"] == r["lr"] for r in train if r["step"] > checkpoint)
    # The lost attempt's rows are what W&B had written to disk at the kill (it writes every 2 s under hpc-train, 15 s
    # by default): the first rows of metrics.jsonl, with the same numbers (the resume is bit-identical).
    before = {s: row["train/loss"] for s, row in lost["rows"].items() if "train/loss" in row}
    assert before, "the lost attempt's W&B file holds no row: W&B wrote nothing to disk in its 3 s"
    assert before == {r["step"]: r["loss"] for r in train if r["step"] <= max(before)} and min(before) == 1
    # The end of the job names the command that uploads both attempts.
    assert f"wandb sync {run_dir / 'wandb'}/offline-run-*-{run_id}" in proc.stdout


def test_mlflow_resumes_the_same_run_and_its_history_equals_metrics_jsonl(resumed):
    run_dir, checkpoint, first, _proc = resumed
    client, run_id = mlflow_client(run_dir)
    assert run_id == first["mlflow"]["run_id"]  # kept in the run dir, continued
    assert first["mlflow"]["tracking_uri"] == f"sqlite:///{run_dir}/mlflow.db"  # one store per job, in its run dir
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == f"{run_dir.parent.name}/run"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    train, evals = metrics(run_dir, "train"), metrics(run_dir, "eval")
    # The lost attempt had logged steps past the checkpoint, which the resumed one logged again: the history holds one
    # value per step all the same, equal to metrics.jsonl.
    assert checkpoint == 8 and first["last_step"] - 1 <= first["mlflow_steps"][-1] <= first["last_step"]
    assert first["mlflow_steps"] == list(range(1, first["mlflow_steps"][-1] + 1))
    assert first["mlflow_steps"][-1] > checkpoint
    assert history(client, run_id, "train_loss") == [(r["step"], r["loss"]) for r in train]
    assert history(client, run_id, "train_lr") == [(r["step"], r["lr"]) for r in train]
    assert history(client, run_id, "eval_loss") == [(r["step"], r["loss"]) for r in evals]
    assert history(client, run_id, "eval_accuracy") == [(r["step"], r["accuracy"]) for r in evals]
    assert [s for s, _ in history(client, run_id, "train_loss")][-1] == 20 > checkpoint
    params = run.data.params
    assert params["trainer.lr"] == "0.1" and params["strategy.name"] == "single" and params["trainer.max_steps"] == "20"
    assert params["logger.trackers.mlflow"] == "true" and params["trainer.weight_decay"] == "0"
    assert "logger=[wandb,mlflow]" in run.data.tags["hpc_train.overrides"]
    assert not client.list_artifacts(run_id)  # logger.log_model=false


# -- killed right after a checkpoint -------------------------------------------------------------------
def test_every_tracker_holds_the_rows_a_checkpoint_covers_when_killed_right_after_it(tmp_path):
    """The trackers are flushed before each checkpoint is written: kill -9 of the whole job (rank 0 and W&B's
    service process with it) as soon as the first checkpoint exists, and each tracker has every row up to its step."""
    from tests.e2e.test_tensorboard import scalars

    run_dir = tmp_path / "run"
    args = [*RESUMED, "logger=[wandb,mlflow,tensorboard]", "logger.mode=offline"]
    proc = start_background(args, run_dir, {"HPC_TRAIN_STEP_SLEEP": "0.3"})
    try:
        wait_for(lambda: checkpoint_steps(run_dir) != [], 120, "the first checkpoint")
    finally:
        kill_group(proc)
    covered = list(range(1, checkpoint_steps(run_dir)[0] + 1))
    assert covered == [1, 2, 3, 4]
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    rows = wandb_run(folder)["rows"]
    assert [s for s in covered if "train/loss" in rows.get(s, {})] == covered, sorted(rows)
    client, run_id = mlflow_client(run_dir)
    assert [s for s, _ in history(client, run_id, "train_loss")][: len(covered)] == covered
    assert [s for s, _ in scalars(run_dir / "tensorboard")["train/loss"]][: len(covered)] == covered


# -- several loggers at once -----------------------------------------------------------------------
def test_tensorboard_and_mlflow_at_once(tmp_path):
    """logger=[tensorboard,mlflow]: both trackers and metrics.jsonl hold the same rows; log_model=true adds model.pt."""
    from tests.e2e.test_tensorboard import scalars

    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            *TRAIN,
            "trainer.max_steps=12",
            "trainer.log_every=4",
            "logger=[tensorboard,mlflow]",
            "logger.log_model=true",
            "logger.experiment=tiny",
        ],
        run_dir,
    )
    assert_ok(proc)
    train = metrics(run_dir, "train")
    assert [r["step"] for r in train] == [4, 8, 12]
    found = scalars(run_dir / "tensorboard")
    assert [s for s, _ in found["train/loss"]] == [4, 8, 12]
    assert [v for _, v in found["train/loss"]] == pytest.approx([r["loss"] for r in train], rel=1e-6)  # float32
    client, run_id = mlflow_client(run_dir)
    assert history(client, run_id, "train_loss") == [(r["step"], r["loss"]) for r in train]
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "tiny"
    assert [a.path for a in client.list_artifacts(run_id)] == ["model.pt"]
    assert f"mlflow ui --backend-store-uri sqlite:///{run_dir}/mlflow.db" in proc.stdout
    assert not (run_dir / "wandb").exists() and not (run_dir / "wandb_run.json").exists()


# -- refusals on the login node ----------------------------------------------------------------------
def hidden(tmp_path: Path, *modules: str) -> Dict[str, str]:
    """An environment whose Python cannot find `modules`, as one without those packages."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules))
    return dict(os.environ, PYTHONPATH=str(shim))


@pytest.mark.parametrize(
    "logger, missing, launcher, pip",
    [
        ("logger=wandb", "wandb", ["launcher=local"], "pip install 'hpc-train[wandb]'"),
        ("logger=mlflow", "mlflow", ["launcher=slurm", "resources.gpus_per_node=2"], "pip install 'hpc-train[mlflow]'"),
        ("logger=[tensorboard,mlflow]", "mlflow", ["launcher=local"], "pip install mlflow-skinny"),
    ],
)
def test_a_missing_tracker_package_is_refused_before_anything_runs(logger, missing, launcher, pip, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli([*TRAIN, "trainer.max_steps=4", *launcher, logger], run_dir, env=hidden(tmp_path, missing))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "invalid configuration for `logger`" in proc.stderr and f"needs the {missing} package" in proc.stderr
    assert pip in proc.stderr and "logger=jsonl" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run_dir / "job_config.yaml").exists() and not (run_dir / "logs").exists()


def test_the_login_node_never_imports_a_tracker(tmp_path):
    """Validation looks the packages up without importing them: a Slurm dry run with every tracker imports none."""
    code = (
        "import sys\nfrom hpc_train.cli import main\n"
        "sys.argv = ['hpc-train', 'launcher=slurm', 'dry_run=true', 'logger=[tensorboard,wandb,mlflow]',"
        f" 'hydra.run.dir={tmp_path}/run']\n"
        "main()\nheavy = [m for m in ('torch', 'tensorboard', 'wandb', 'mlflow') if m in sys.modules]\n"
        "assert not heavy, heavy\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr
