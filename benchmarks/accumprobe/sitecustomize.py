"""Counts DDP's gradient all-reduces and times optimizer steps in any Python process started with
this folder first on PYTHONPATH and HPC_BENCH_ACCUMPROBE_DIR set (benchmarks/grad_accum.py).

hpc-train's workers and the plain DDP loops are counted and timed the same way, with no change
to either. Once `torch` is imported, the probe:

* registers a DDP communication hook on every `DistributedDataParallel` right after it is built:
  torch's own `default_hooks.allreduce_hook` (divide the bucket by the world size, one
  `all_reduce` of it: what DDP's built-in path does), wrapped to count each call (= one gradient
  bucket all-reduced) and the bucket's bytes. DDP calls the hook only for buckets it actually
  reduces: nothing inside `no_sync()`;
* counts every call of `torch.distributed.all_reduce` made from Python (the hook's own calls
  included: the other all-reduces of a step are the difference, e.g. hpc-train's stop-signal
  agreement and its logged loss);
* records, at the end of every optimizer step (a global optimizer step post hook), the time
  (perf_counter, s) and the three running counts.

At exit a process that took optimizer steps writes its record to
$HPC_BENCH_ACCUMPROBE_DIR/accum-rank<RANK>-<pid>.json. HPC_BENCH_ACCUMPROBE_HOOK=0 keeps the step
times only (no comm hook, no all_reduce wrapper): to check that counting does not change timing.
"""

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import time

_DIR = os.environ.get("HPC_BENCH_ACCUMPROBE_DIR")
_COUNT = os.environ.get("HPC_BENCH_ACCUMPROBE_HOOK", "1") != "0"
_counts = {"bucket_calls": 0, "bucket_bytes": 0, "all_reduce_calls": 0, "ddp_hooked": 0}
_events = {"opt_end": [], "bucket_calls": [], "bucket_bytes": [], "all_reduce_calls": []}


def _install() -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    clock = time.perf_counter

    def on_step(opt, args, kwargs):
        _events["opt_end"].append(clock())
        for key in ("bucket_calls", "bucket_bytes", "all_reduce_calls"):
            _events[key].append(_counts[key])

    register_optimizer_step_post_hook(on_step)
    if not _COUNT:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    original_all_reduce = dist.all_reduce

    def counted_all_reduce(*args, **kwargs):
        _counts["all_reduce_calls"] += 1
        return original_all_reduce(*args, **kwargs)

    dist.all_reduce = counted_all_reduce

    def counting_hook(state, bucket):
        _counts["bucket_calls"] += 1
        buffer = bucket.buffer()
        _counts["bucket_bytes"] += buffer.numel() * buffer.element_size()
        return default_hooks.allreduce_hook(state, bucket)

    original_init = DistributedDataParallel.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.register_comm_hook(None, counting_hook)  # None: the default process group, as DDP's own path
        _counts["ddp_hooked"] += 1

    DistributedDataParallel.__init__ = init
    del torch


class _AfterTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets `import torch` run normally, then installs the hooks (a launcher that never imports torch is untouched)."""

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
        rank = os.environ.get("RANK", "0")
        torch = sys.modules.get("torch")
        threads = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()} if torch else None
        with open(os.path.join(_DIR, f"accum-rank{rank}-{os.getpid()}.json"), "w") as handle:
            hpc = sys.modules.get("hpc_train")
            json.dump(
                {
                    "pid": os.getpid(),
                    "rank": int(rank),
                    "argv": sys.argv,
                    "hpc_train": getattr(hpc, "__file__", None),
                    "counting": _COUNT,
                    "threads": threads,
                    "ddp_hooked": _counts["ddp_hooked"],
                    **_events,
                },
                handle,
            )
    except Exception:  # never break the measured process
        pass


if _DIR:
    sys.meta_path.insert(0, _AfterTorch())
    atexit.register(_write)
