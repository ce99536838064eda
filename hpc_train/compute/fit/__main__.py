"""``python -m hpc_train.compute.fit JOB_SPEC [--ranks 0,2] [--json]``: a job's memory estimate in a process of its
own, from the job spec hpc-train writes (``<run dir>/job_config.yaml``). The login side, which never imports torch,
runs this when an estimate is asked for and reads its output.

Prints the estimate (``--json``: as one JSON object, ``hpc_train.compute.fit.breakdown.JobEstimate.as_dict``) and exits
EXIT_OK; a job the estimate cannot simulate prints one line on stderr and exits EXIT_REFUSED.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from omegaconf import DictConfig, OmegaConf

from hpc_train.compute.fit.estimate import EstimateSettings, estimate_job
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.settings import JobSettings, section
from hpc_train.compute.user.instantiate import add_code_dirs
from hpc_train.records.rundir import EXIT_OK, EXIT_REFUSED


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.compute.fit", description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="the job spec (a run dir's job_config.yaml)")
    parser.add_argument("--ranks", help="the ranks to estimate, e.g. 0,2 (default: the first of each pipeline stage)")
    parser.add_argument("--json", action="store_true", help="print the estimate as one JSON object")
    args = parser.parse_args(argv)
    spec = OmegaConf.load(args.spec)
    assert isinstance(spec, DictConfig)
    add_code_dirs(section(JobSettings, spec.job).code_dirs)  # the user's package, importable as on the ranks
    ranks = [int(rank) for rank in args.ranks.split(",")] if args.ranks else None
    try:
        estimate = estimate_job(EstimateSettings.from_job_spec(spec), ranks)
    except Refusal as refusal:
        print(f"hpc-train: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(estimate.as_dict()) if args.json else estimate.describe())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
