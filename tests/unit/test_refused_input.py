"""Bad input is refused before anything runs: one paragraph naming the key and the fix, exit != 0, no traceback.

The `hpc-train` entry point is called in this process (run_cli_in_process): a refusal starts nothing. Refusals that
ask Slurm first (a packed sweep's, after sinfo): tests/e2e/test_bad_input.py.
"""

import pytest

from tests.support.cli import TINY, TINY_TRAINER, assert_ok, run_cli_in_process


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        (["data=imagefolder"], "data.root", "data.root=/path/to/dataset"),
        (["data=imagefolder", "data.root=/nonexistent/dataset", "data.num_classes=3"], "data.root", "data.root="),
        (["strategy=ddp", "resources.gpus_per_node=2", "trainer.batch_size=63"], "trainer.batch_size", "multiple of 2"),
        (["trainer.epochs=0"], "trainer.epochs", "trainer.epochs=1"),
        (["trainer.epochs=-3"], "trainer.epochs", "trainer.epochs=1"),
        (["trainer.epochs=null", "trainer.max_steps=0"], "trainer.max_steps", "trainer.max_steps=1"),
        (["trainer.epochs=null", "trainer.max_steps=-5"], "trainer.max_steps", "trainer.max_steps=1"),
        (["trainer.epochs=null", "trainer.max_steps=null"], "trainer.epochs", "trainer.max_steps="),
        (["trainer.precision=8"], "trainer.precision", "trainer.precision=bf16"),
        (["resources.nodes=2"], "resources.nodes", "launcher=slurm"),
        (["resume=/no/such/checkpoint.pt"], "resume", "resume=auto"),
        # unknown options and keys: named, with the nearest valid spelling
        (["model=resnet9"], "model", "resnet18"),
        (["data=cifar"], "data", "digits, imagefolder, synthetic"),
        (["strategy=pipelnie"], "strategy", "model_parallel, pipeline"),
        (["cluster=no_such_cluster"], "cluster", "jean_zay"),
        (["launcher=slurm", "cluster.partiton=gpu"], "cluster.partiton", "partition"),
        (["trainer.lrr=0.1"], "trainer.lrr", "lr"),
        (["sed=1"], "sed", "seed"),
        # quotes that would break the command line are refused, not passed on half-parsed
        (['job_name=a"b'], "job_name", '"job_name=\'a\\"b\'"'),
        # the character named, and a fix that survives the shell's quote removal
        (
            ["container.image=nvcr.io#nvidia/pytorch:24.05-py3"],
            "container.image",
            "\"container.image='nvcr.io#nvidia/pytorch:24.05-py3'\"",
        ),
        # GPU count incompatible with the strategy, chunks that do not divide the batch
        (
            ["launcher=slurm", "strategy=model_parallel", "strategy.stages=3", "resources.gpus_per_node=2"],
            "strategy.stages",
            "resources.gpus_per_node=3",
        ),
        (
            ["strategy=pipeline", "resources.gpus_per_node=2", "strategy.chunks=3"],
            "trainer.batch_size",
            "multiple of 3",
        ),
        (["strategy=ddp", "resources.gpus_per_node=0"], "resources.gpus_per_node", "resources.gpus_per_node=1"),
        # checkpoint and requeue settings
        (["trainer.checkpoint_every=-1"], "trainer.checkpoint_every", "trainer.checkpoint_every=100"),
        (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints", "trainer.keep_checkpoints=2"),
        (["trainer.max_requeues=-1"], "trainer.max_requeues", "trainer.max_requeues=3"),
        (["launcher=slurm", "launcher.signal=HUP"], "launcher.signal", "launcher.signal=USR2"),
        (["launcher=slurm", "launcher.signal_delay_s=0"], "launcher.signal_delay_s", "launcher.signal_delay_s=120"),
        (["launcher=slurm", "resources.time=0"], "resources.time", "resources.time=01:00:00"),
        # every key's type and range (hpc_train/config/), found from outside
        (["data.num_classes=0"], "data.num_classes", "data.num_classes=N"),
        (["seed=abc"], "seed", "seed=0"),
        (["trainer.log_every=0"], "trainer.log_every", "trainer.log_every=10"),
        (["trainer.momentum=abc"], "trainer.momentum", "trainer.momentum=0.9"),
        (["cluster=jean_zay", "cluster.gpu_type=b200"], "cluster.gpu_type", "cluster.gpu_type=a100"),
        (["data.image_size=0"], "data.image_size", "data.image_size=32"),
        (["dry_run=maybe"], "dry_run", "dry_run=true"),
        # ... and a few more kinds: non-ASCII where Slurm reads it, a node replaced by a number, huge and wrong-typed
        # numbers
        (["launcher=slurm", "dry_run=true", "job_name='r\u00e9seau'"], "job_name", "job_name=resnet-ddp"),
        (
            ["launcher=slurm", "dry_run=true", "cluster.partition='gpu \u00e9'"],
            "cluster.partition",
            "cluster.partition=gpu",
        ),
        (["trainer.loss=5"], "trainer.loss", "trainer.loss._target_="),
        (["launcher.master_port=99999999999999999999"], "launcher.master_port", "launcher.master_port=29500"),
        (["resources.nodes=abc"], "resources.nodes", "resources.nodes=1"),
        # a range of nodes: MIN-MAX with 1 <= MIN < MAX, for the strategies whose checkpoints resume at another world
        (
            ["launcher=slurm", "dry_run=true", "strategy=ddp", "resources.nodes=4-2"],
            "resources.nodes",
            "resources.nodes=2-4",
        ),
        (
            ["launcher=slurm", "dry_run=true", "strategy=ddp", "resources.nodes=0-3"],
            "resources.nodes",
            "resources.nodes=2-4",
        ),
        (
            ["launcher=slurm", "dry_run=true", "strategy=ddp", "resources.nodes=a-b"],
            "resources.nodes",
            "resources.nodes=2-4",
        ),
        (
            ["launcher=slurm", "dry_run=true", "strategy=ddp", "resources.nodes=2-"],
            "resources.nodes",
            "resources.nodes=2-4",
        ),
        (
            ["launcher=slurm", "dry_run=true", "strategy=hybrid", "resources.nodes=2-4"],
            "resources.nodes",
            "strategy=ddp, fsdp or mesh",
        ),
        (
            [
                "launcher=slurm",
                "dry_run=true",
                "strategy=ddp",
                "resources.nodes=2-4",
                "resources.gpus_per_node=1",
                "trainer.batch_size=16",
            ],
            "trainer.batch_size",
            "resources.nodes=2.",
        ),
        (["trainer.lr=nan"], "trainer.lr", "trainer.lr=0.05"),
        # training recipes: each key's range, and the keys that must agree
        (["trainer.optimizer=lion"], "trainer.optimizer", "_target_: torch.optim.AdamW"),
        (["trainer.param_groups=no_decay"], "trainer.param_groups", "no_decay_1d"),
        (["trainer.grad_clip=0"], "trainer.grad_clip", "trainer.grad_clip=1.0"),
        (["trainer.grad_accum_steps=0"], "trainer.grad_accum_steps", "trainer.grad_accum_steps=1"),
        (["trainer.ema_decay=1"], "trainer.ema_decay", "trainer.ema_decay=0.999"),
        (["trainer.eval_every=0"], "trainer.eval_every", "trainer.eval_every=500"),
        (["trainer.eval_batches=-1"], "trainer.eval_batches", "trainer.eval_batches=20"),
        (
            ["strategy=ddp", "resources.gpus_per_node=2", "trainer.batch_size=36", "trainer.grad_accum_steps=4"],
            "trainer.batch_size",
            "trainer.grad_accum_steps",
        ),
        (
            [
                "strategy=pipeline",
                "strategy.engine=pipelining",
                "resources.gpus_per_node=2",
                "trainer.grad_accum_steps=2",
            ],
            "trainer.grad_accum_steps",
            "strategy.chunks=",
        ),
        (["strategy=pipeline", "trainer.ema_decay=0.9"], "trainer.ema_decay", "trainer.ema_decay=null"),
        (["trainer.lr_schedule=cosine", "trainer.min_lr=0.5"], "trainer.min_lr", "trainer.min_lr=0.01"),
        (
            [
                "trainer.lr_schedule={_target_:torch.optim.lr_scheduler.StepLR,_partial_:true,step_size:3}",
                "trainer.lr_warmup_steps=5",
            ],
            "trainer.lr_warmup_steps",
            "trainer.lr_warmup_steps=0",
        ),
        # strategy=mesh: dimensions that do not fit the world, tp across nodes, a missing or unknown plan, the batch
        (["strategy=mesh", "resources.gpus_per_node=4", "strategy.tp=2"], "strategy.tp_plan", "tp_plan:"),
        (["strategy=mesh", "resources.gpus_per_node=4", "strategy.tp=3"], "strategy.dp_shard", "product divides 4"),
        (
            ["strategy=mesh", "resources.gpus_per_node=4", "strategy.dp_shard=3"],
            "strategy.dp_shard",
            "strategy.dp_shard=-1",
        ),
        (
            [
                "launcher=slurm",
                "dry_run=true",
                "strategy=mesh",
                "resources.nodes=2",
                "resources.gpus_per_node=2",
                "strategy.tp=4",
                "strategy.dp_shard=1",
                "strategy.tp_plan={1:colwise}",
            ],
            "strategy.tp",
            "divisors of 2",
        ),
        (["strategy=mesh", "strategy.tp_plan={1:diagonal}"], "strategy.tp_plan", "colwise, rowwise or colwise_gather"),
        (["strategy=mesh", "strategy.pp=0"], "strategy.pp", "strategy.pp=2"),
        (
            ["strategy=mesh", "resources.gpus_per_node=4", "strategy.pp=2", "trainer.batch_size=12"],
            "trainer.batch_size",
            "multiple of 8",
        ),
        (
            ["strategy=mesh", "resources.gpus_per_node=2", "strategy.pp=2", "trainer.grad_accum_steps=2"],
            "trainer.grad_accum_steps",
            "strategy.chunks=8",
        ),
        # your own script (`-- train.py ARGS` is script.argv; the `--` spelling: test_bad_script_command_is_refused)
        (["script.argv=[no_such_train.py]"], "script.argv", "-- train.py ARGS"),
        (["script.argv=[-m,no_such_module_xyz]"], "script.argv", "pip install -e"),
        (["script.argv=[]"], "script.argv", "after `--`"),
        (
            ["strategy=single", "script.launcher=torchrun", "script.argv=[tests/support/scripts/ddp_allreduce.py]"],
            "script.launcher",
            "strategy=ddp",
        ),
    ],
)
def test_bad_input_is_refused_with_key_and_fix(overrides, key, fix, tmp_path):
    run_dir = tmp_path / "run"
    base = TINY_TRAINER if any(o.startswith("data=") for o in overrides) else TINY
    proc = run_cli_in_process([*base, *overrides], run_dir, refused=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert f"`{key}`" in message and "Fix:" in message and fix in message, message
    assert "\n" not in message, "the error must be one paragraph"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (run_dir / "job_config.yaml").exists(), "nothing may start after a config error"


def test_imagefolder_class_count_must_match(tmp_path):
    root = tmp_path / "data"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            (root / split / cls / "a.png").write_bytes(b"not really a png")
    proc = run_cli_in_process(
        [*TINY_TRAINER, "data=imagefolder", f"data.root={root}", "data.num_classes=3"], tmp_path / "run", refused=True
    )
    assert proc.returncode == 2
    assert "`data.num_classes`" in proc.stderr and "data.num_classes=2" in proc.stderr


def test_unwritable_output_dir_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os

        if os.access(locked, os.W_OK):  # root ignores permission bits: use a path under a file instead
            blocker = tmp_path / "a_file"
            blocker.write_text("")
            run_dir = blocker / "run"
        else:
            run_dir = locked / "run"
        proc = run_cli_in_process(TINY, run_dir, refused=True)
    finally:
        locked.chmod(0o700)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "hydra.run.dir" in proc.stderr


def test_empty_imagefolder_root_is_refused(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    proc = run_cli_in_process(
        [*TINY_TRAINER, "data=imagefolder", f"data.root={root}", "data.num_classes=3"], tmp_path / "run", refused=True
    )
    assert proc.returncode == 2
    assert "`data.root`" in proc.stderr and "Fix:" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args, key, fix",
    [
        (["--", "no_such_train.py", "--batch_size=32"], "script.argv", "-- train.py ARGS"),
        (["--", "-m", "no_such_module_xyz", "--lr=1"], "script.argv", "pip install -e"),
        (["--", "-m", "no_such_package_xyz.train"], "script.argv", "No module named 'no_such_package_xyz'"),
        (["--", "-m"], "script.argv", "-- -m package.module"),
        (["--"], "script.argv", "after `--`"),
        (
            ["strategy=single", "script.launcher=torchrun", "--", "tests/support/scripts/ddp_allreduce.py"],
            "script.launcher",
            "strategy=ddp",
        ),
    ],
)
def test_bad_script_command_is_refused_before_anything_is_queued(args, key, fix, tmp_path):
    """`hpc-train [overrides] -- SCRIPT ARGS` as typed: refused on the login node, naming the key, nothing submitted."""
    run_dir = tmp_path / "run"
    proc = run_cli_in_process(["launcher=slurm", f"hydra.run.dir={run_dir}", *args], refused=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert f"`{key}`" in message and "Fix:" in message and fix in message, message
    assert "\n" not in message and "Traceback" not in proc.stdout + proc.stderr
    assert "submitted" not in proc.stdout and not (run_dir / "slurm").exists()
    assert not (run_dir / "job_config.yaml").exists(), "nothing may be queued after a config error"


@pytest.mark.parametrize(
    "override, expected",
    [("strategy=does_not_exist", "strategy"), ("trainer.batchsize=3", "trainer.batchsize")],
)
def test_cli_rejects_unknown_option_or_key(override, expected, tmp_path):
    proc = run_cli_in_process([override], tmp_path / "run", refused=True)
    assert proc.returncode != 0
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "run" / "job_config.yaml").exists()


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy.replicate=3", "resources.gpus_per_node=4"], "strategy.replicate"),
        (["strategy.replicate=half"], "strategy.replicate"),
        (["strategy=pipeline", "trainer.activation_checkpointing=blocks"], "trainer.activation_checkpointing"),
    ],
)
def test_bad_fsdp_settings_are_refused_before_anything_runs(overrides, key, tmp_path):
    proc = run_cli_in_process([*TINY, "strategy=fsdp", *overrides, "dry_run=true"], tmp_path / "run")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and f"`{key}`" in out and "Fix:" in out and "Traceback" not in out, out


# -- strategies: combinations no layout can take (what only the built model tells: tests/e2e/test_strategies.py) --
STRATEGIES_RUN = [*TINY, "trainer.batch_size=32", "trainer.max_steps=20", "trainer.epochs=null", "trainer.eval=false"]
STRATEGIES_RUN += ["seed=7"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy=hybrid", "strategy.stages=3", "resources.gpus_per_node=4"], "strategy.stages"),
        (["strategy=pipeline", "strategy.chunks=64", "trainer.batch_size=32"], "strategy.chunks"),
        (["strategy=pipeline", "resources.nodes=2"], "resources.nodes"),
        (["strategy=pipeline", "strategy.balance=[1,1,2]", "strategy.stages=2"], "strategy.balance"),
        (["strategy=pipeline", "strategy.split_points=[2]", "strategy.stages=3"], "strategy.stages"),
        (["strategy=pipeline", "strategy.split_points=[2]", "strategy.balance=time"], "strategy.balance"),
        (["strategy=pipeline", "strategy.split_points=[2,2]"], "strategy.split_points"),
        (["strategy=pipeline", "strategy.batchnorm=sync"], "strategy.batchnorm"),
        (
            [
                "strategy=pipeline",
                "strategy.engine=pipelining",
                "resources.gpus_per_node=2",
                "strategy.schedule=1f1b",
                "strategy.chunks=1",
            ],
            "strategy.chunks",
        ),
        (
            ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2", "strategy.stages=3"],
            "strategy.stages",
        ),
        (
            ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2", "trainer.precision=16"],
            "trainer.precision",
        ),
    ],
)
def test_invalid_combinations_fail_before_running(overrides, key, tmp_path):
    proc = run_cli_in_process([*STRATEGIES_RUN, *overrides], tmp_path / "run", refused=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"`{key}`" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "job_config.yaml").exists()


# -- loggers and trackers (a missing package, in a new interpreter that cannot find it: tests/e2e/test_trackers.py) --
TRACKED_RUN = [*TINY, "trainer.epochs=null", "trainer.batch_size=32", "strategy=single"]
LOGGED_RUN = [*TINY, "trainer.max_steps=12", "trainer.epochs=null", "trainer.batch_size=32", "trainer.log_every=4"]


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["logger=mlflow", "logger.tracking_uri=/tmp/mlruns"], "logger.tracking_uri", "MLFLOW_ALLOW_FILE_STORE=true"),
        (["logger=mlflow", "logger.tracking_uri=file:///tmp/mlruns"], "logger.tracking_uri", "sqlite:////abs/path"),
        (["logger=wandb", "logger.mode=sometimes"], "logger.mode", "logger.mode=offline"),
        (["logger=wandb", "logger.project=a/b"], "logger.project", "logger.project=my-project"),
        (["logger=[tensorboard,mlflow]", "+logger.trackers.comet=true"], "logger", "unknown logger 'comet'"),
        (["logger.name=mlflow"], "logger", "logger.name alone does not pick a logger"),
    ],
)
def test_bad_tracker_settings_are_refused(overrides, key, words, tmp_path):
    proc = run_cli_in_process([*TRACKED_RUN, "trainer.max_steps=4", "dry_run=true", *overrides], tmp_path / "run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"invalid configuration for `{key}`" in proc.stderr and words in proc.stderr, proc.stderr


def test_unknown_logger_is_refused(tmp_path):
    proc = run_cli_in_process([*LOGGED_RUN, "logger.name=wandb"], tmp_path / "run", refused=True)
    assert proc.returncode == 2 and "invalid configuration for `logger`" in proc.stderr


# -- a user's training step (one that fails at the job's start: tests/e2e/test_user_step.py) --------------------
def step_node(target: str) -> str:
    return f"trainer.step={{_target_:{target},_partial_:true}}"


@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=pipeline"],
        ["strategy=model_parallel"],
        ["strategy=hybrid"],
        ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2"],
    ],
    ids=["pipeline", "model_parallel", "hybrid", "pipelining"],
)
def test_split_strategies_refuse_a_user_step_on_the_login_node(strategy, tmp_path):
    proc = run_cli_in_process(
        [*TINY, *strategy, step_node("hpc_train.compute.training.steps.model_loss")], tmp_path / "run", refused=True
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "`trainer.step`" in out and "strategy=" in out and "Fix:" in out and "Traceback" not in out, out
    assert not (tmp_path / "run" / "job_config.yaml").exists(), "refused before anything is made"


def test_a_metric_objective_needs_a_user_step(tmp_path):
    proc = run_cli_in_process([*TINY, "objective=eval_top1", "dry_run=true"], tmp_path / "run")
    assert proc.returncode == 2 and "`objective`" in proc.stderr + proc.stdout, proc.stdout + proc.stderr
    proc = run_cli_in_process(
        [*TINY, "objective=eval_top1", "dry_run=true", step_node("tests.support.user_steps.cross_entropy")]
    )
    assert_ok(proc)
