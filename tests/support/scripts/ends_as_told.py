"""A user's script that ends as ``--end=`` says: ``complete`` (exit 0), ``fail`` (an exception) or ``wait`` (until
it is stopped); ``--sleep=S`` first sleeps S seconds. It marks its start in ``$HPC_TRAIN_RUN_DIR/started``; no torch,
so a Slurm job of it starts fast."""

import os
import sys
import time
from pathlib import Path

end = next((arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--end=")), "complete")
sleep = float(next((arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--sleep=")), 0))
(Path(os.environ["HPC_TRAIN_RUN_DIR"]) / "started").write_text(end)
print(f"ends_as_told: {end}", flush=True)
time.sleep(sleep)
if end == "fail":
    raise RuntimeError("ends_as_told was told to fail")
while end == "wait":
    time.sleep(0.2)
