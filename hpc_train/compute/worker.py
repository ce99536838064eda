"""`python -m hpc_train.compute.worker JOB_CONFIG.yaml`: one rank of a job (used by the local launcher and sbatch scripts)."""

from __future__ import annotations

import sys
from pathlib import Path

from hpc_train.compute.entry import load_job_spec, train


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpc_train.compute.worker RUN_DIR/job_config.yaml", file=sys.stderr)
        return 2
    try:
        train(load_job_spec(Path(argv[0])))
    except Exception:  # the traceback is already in logs/rank<r>.log and on stderr below
        import traceback

        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
