"""The library staged for an image that has only PyTorch holds every package the ranks import beside torch."""

from __future__ import annotations

import json
import subprocess
import sys

from hpc_train.containers.library import RANK_PACKAGES

PROBE = """
import json, sys
import torch
with_torch = set(sys.modules)
import hpc_train.compute.worker, hpc_train.compute.entry.train, hpc_train.compute.entry.job
import hpc_train.compute.entry.script_job, hpc_train.pack.app_step, hpc_train.containers.inside
import hpc_train.launch.hydra.app_task, hydra_plugins.hpc_train_launcher
import submitit.core._submit
new = {name.split(".")[0] for name in set(sys.modules) - with_torch}
print(json.dumps(sorted(n for n in new if n not in sys.stdlib_module_names and not n.startswith("_"))))
"""
OPTIONAL = {"attr"}  # omegaconf uses attrs where installed, and runs without it


def test_every_package_the_ranks_import_beside_torch_is_staged():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    imported = set(json.loads(out.strip().splitlines()[-1]))
    staged = {name.split(".")[0] for name in RANK_PACKAGES}
    assert imported - OPTIONAL <= staged, f"imported by the ranks but not staged: {sorted(imported - staged)}"
