"""Per-step timing of any Python process started with this folder first on PYTHONPATH.

benchmarks/overhead_probe.py puts this folder on PYTHONPATH and sets HPC_BENCH_STEPPROBE_DIR, so
hpc-train's worker and the plain loop are timed the same way without a change to either. Once
`torch` is imported, the probe records for every training step (perf_counter, seconds):

* `fetch`: the DataLoader's `__next__` start and end (sampler, dataset indexing, collate);
* `opt`: the optimizer step's start (after forward and backward) and end (global optimizer
  step pre/post hooks).

At exit a process that took optimizer steps writes them (and where it imported hpc_train from) to
$HPC_BENCH_STEPPROBE_DIR/steps-<pid>.json.
The hooks cost about a microsecond a step; processes that never step write nothing.
"""

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import time

_DIR = os.environ.get("HPC_BENCH_STEPPROBE_DIR")
_events = {"fetch_start": [], "fetch_end": [], "opt_start": [], "opt_end": []}


def _install() -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.utils.data import dataloader

    clock = time.perf_counter
    register_optimizer_step_pre_hook(lambda opt, args, kwargs: _events["opt_start"].append(clock()))
    register_optimizer_step_post_hook(lambda opt, args, kwargs: _events["opt_end"].append(clock()))
    original_next = dataloader._BaseDataLoaderIter.__next__

    def timed_next(self):
        _events["fetch_start"].append(clock())
        try:
            return original_next(self)
        finally:
            _events["fetch_end"].append(clock())

    dataloader._BaseDataLoaderIter.__next__ = timed_next
    del torch


class _AfterTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets `import torch` run normally, then installs the hooks (the launcher never imports torch)."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            _install()

        spec.loader.exec_module = exec_module
        return spec


def _write() -> None:
    if not _events["opt_end"]:
        return
    try:
        with open(os.path.join(_DIR, f"steps-{os.getpid()}.json"), "w") as handle:
            hpc = sys.modules.get("hpc_train")
            json.dump(
                {"pid": os.getpid(), "argv": sys.argv, "hpc_train": getattr(hpc, "__file__", None), **_events}, handle
            )
    except Exception:  # never break the measured process
        pass


if _DIR:
    sys.meta_path.insert(0, _AfterTorch())
    atexit.register(_write)
