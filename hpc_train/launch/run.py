"""What one `hpc-train` job does on the launch side: plan, validate, then start or submit."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from hpc_train.launch.jobspec import build_job_spec, write_job_spec
from hpc_train.launch.local import run_local
from hpc_train.launch.plan import make_plan

SUMMARY_NAME = "summary.json"


def run_job(cfg: DictConfig, run_dir: Path) -> int:
    """Run one configured job; returns the exit code. Raises ConfigError for bad input."""
    plan = make_plan(cfg, run_dir)
    spec = build_job_spec(cfg, plan)
    launcher = cfg.launcher.name
    if cfg.dry_run:
        print(f"hpc-train (dry run, launcher={launcher}): {plan.layout.describe()}")
        print(f"  run dir: {run_dir}")
        return 0
    config_path = write_job_spec(spec, run_dir)
    print(f"hpc-train: {plan.layout.describe()}")
    print(f"hpc-train: run dir {run_dir}")
    code = run_local(plan, config_path, cfg.launcher.get("master_port"))
    _report(run_dir, code)
    return code


def _report(run_dir: Path, code: int) -> None:
    summary = run_dir / SUMMARY_NAME
    if code == 0 and summary.exists():
        data = json.loads(summary.read_text())
        acc = data.get("eval_accuracy")
        acc_text = "n/a" if acc is None else f"{acc:.4f}"
        print(
            f"hpc-train: done: {data['global_step']} steps, train_loss {data['train_loss']:.4f}, "
            f"eval_accuracy {acc_text}, {data['images_per_sec']:.1f} images/s"
        )
        print(f"hpc-train: summary {summary}")
        print(f"hpc-train: metrics {run_dir / 'metrics.jsonl'}")
        print(f"hpc-train: logs    {run_dir / 'logs'}")
    else:
        print(f"hpc-train: the job failed (exit code {code}); see the logs in {run_dir / 'logs'}")
