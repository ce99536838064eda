"""What each task of the 3,000-job scale test runs instead of training: a no-op that leaves a mark.

3,000 real training tasks would import torch 3,000 times (about 2 s of CPU each, over an hour
on the 2-core CI machine); the scale test is about queueing, chunking, throttling and counting,
which is the same for any task. Picklable by reference (tests/ is importable from the repo root,
where the tasks start).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict


class Probe:
    def __init__(self, spec: Dict[str, Any]) -> None:
        self.run_dir = Path(spec["job"]["run_dir"])

    def __call__(self) -> str:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "probe.done").write_text("ran\n")
        return str(self.run_dir)
