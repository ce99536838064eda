"""Peak GPU memory of any Python process started with this folder first on PYTHONPATH.

benchmarks/gpu_throughput.py puts this folder on PYTHONPATH and sets HPC_BENCH_PEAKMEM_DIR, so
hpc-train's worker process and the plain loop report their peak memory the same way without a
change to either: at exit, a process that initialised CUDA writes
torch.cuda.max_memory_allocated / max_memory_reserved of every device to
$HPC_BENCH_PEAKMEM_DIR/peak-<pid>.json. Processes that never touched CUDA write nothing.
"""

import atexit
import json
import os
import sys


def _write_peak() -> None:
    directory = os.environ.get("HPC_BENCH_PEAKMEM_DIR")
    torch = sys.modules.get("torch")
    if not directory or torch is None:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        peaks = {
            str(i): {
                "max_allocated": torch.cuda.max_memory_allocated(i),
                "max_reserved": torch.cuda.max_memory_reserved(i),
            }
            for i in range(torch.cuda.device_count())
        }
        with open(os.path.join(directory, f"peak-{os.getpid()}.json"), "w") as handle:
            json.dump({"pid": os.getpid(), "argv": sys.argv, "devices": peaks}, handle)
    except Exception:  # never break the measured process
        pass


if os.environ.get("HPC_BENCH_PEAKMEM_DIR"):
    atexit.register(_write_peak)
