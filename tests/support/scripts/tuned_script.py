"""A user's script swept by an adaptive study, unable to resume (no script.resume_args): gradient descent on
(w - 3)^2 from w = 0, ``--steps=N`` steps at ``--lr=X``, ``--sleep=S`` seconds apart, the loss reported with
hpc_train.report_objective at every step (and as train_loss with hpc_train.log_metrics, so that its summary has it
too). Each start appends its step count to ``$HPC_TRAIN_RUN_DIR/runs.txt``."""

import os
import sys
import time

import hpc_train

args = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
steps, lr, pause = int(args["steps"]), float(args["lr"]), float(args.get("sleep", 0))
with open(os.path.join(os.environ["HPC_TRAIN_RUN_DIR"], "runs.txt"), "a") as handle:
    handle.write(f"{steps}\n")
w = 0.0
for step in range(1, steps + 1):
    time.sleep(pause)
    w -= lr * 2 * (w - 3.0)
    hpc_train.report_objective(step, (w - 3.0) ** 2)
    hpc_train.log_metrics(step, loss=(w - 3.0) ** 2)
