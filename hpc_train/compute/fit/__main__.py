"""``python -m hpc_train.compute.fit SPEC [SPEC ...] [--ranks 0,2] [--json] [--workers N] [--device gpu|cpu]``: job
specs' memory estimates in a process of their own, each from a job spec that hpc-train writes
(``<run dir>/job_config.yaml``), for ranks on GPUs (the default: what the memory check asks) or on CPUs
(``--device cpu``: as the estimate's comparison with CPU runs measures). The login side, which never imports torch,
runs this when an estimate is asked for (a job and the layouts it suggests, in one go) and reads its output.

One spec: prints its estimate (``--json``: one JSON object) and exits EXIT_OK; a job the estimate cannot simulate
prints one line on stderr (``hpc-train: <what, and the fix>``) and exits EXIT_REFUSED.

Several specs: each is estimated (``--workers N``: in N processes at once; default 1, in this one), and the answers
are printed in the order of the specs, one per spec; the exit code is EXIT_OK, refusals included. With ``--json``
each answer is one line holding one JSON object:

* an estimate: ``hpc_train.compute.fit.breakdown.JobEstimate.as_dict``, ``{"layout": "<the layout in words>",
  "seconds": <to estimate>, "ranks": [{"rank", "stage", "coordinates", "parameters", "gradients",
  "optimizer_state", "activations", "temporaries", "transient", "inputs", "peak", ...}, ...]}`` (bytes; one entry
  per rank estimated);
* a spec it cannot estimate: ``{"refused": "<the one-line message, without the hpc-train: prefix>"}``.

Without ``--json`` each answer is the spec's path on a line, then its estimate in words or ``refused: <message>``.
A failure other than a refusal (a crash of the user's code, say) ends the process with its traceback.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from hpc_train.compute.fit.estimate import DEVICES, EstimateSettings, estimate_job
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.settings import JobSettings, section
from hpc_train.compute.user.instantiate import add_code_dirs
from hpc_train.records.rundir import EXIT_OK, EXIT_REFUSED

Answer = Tuple[Dict[str, Any], str]  # (the JSON object, the words) for one spec


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.compute.fit", description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", metavar="spec", help="a job spec (a run dir's job_config.yaml)")
    parser.add_argument("--ranks", help="the ranks to estimate, e.g. 0,2 (default: the first of each pipeline stage)")
    parser.add_argument("--json", action="store_true", help="print each estimate as one JSON object, one a line")
    parser.add_argument("--workers", type=int, default=1, help="estimate the specs in this many processes")
    parser.add_argument("--costs", action="store_true", help="count each rank's step costs too (one step more)")
    parser.add_argument("--device", choices=DEVICES, default=DEVICES[0], help="where the job's ranks run")
    args = parser.parse_args(argv)
    ranks = [int(rank) for rank in args.ranks.split(",")] if args.ranks else None
    answers = _answers(args.specs, ranks, max(1, args.workers), args.costs, args.device)
    if len(answers) == 1 and "refused" in answers[0][0]:
        print(f"hpc-train: {answers[0][0]['refused']}", file=sys.stderr)
        return EXIT_REFUSED
    for path, (data, words) in zip(args.specs, answers):
        if args.json:
            print(json.dumps(data), flush=True)
        else:
            print(words if len(answers) == 1 else f"{path}\n{words}", flush=True)
    return EXIT_OK


def _answers(paths: Sequence[str], ranks: Optional[List[int]], workers: int, costs: bool, device: str) -> List[Answer]:
    """Each spec's answer, in order: in this process, or in `workers` processes (forked: torch is imported already
    and has run nothing)."""
    if workers == 1 or len(paths) == 1:
        return [answer(path, ranks, costs, device) for path in paths]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(min(workers, len(paths)), mp_context=context) as pool:
        every = len(paths)
        return list(pool.map(answer, paths, [ranks] * every, [costs] * every, [device] * every))


def answer(path: str, ranks: Optional[List[int]], costs: bool = False, device: str = DEVICES[0]) -> Answer:
    """The estimate of the job spec at `path` (or its refusal): as JSON data and in words."""
    spec = OmegaConf.load(path)
    assert isinstance(spec, DictConfig)
    add_code_dirs(section(JobSettings, spec.job).code_dirs)  # the user's package, importable as on the ranks
    try:
        estimate = estimate_job(EstimateSettings.from_job_spec(spec, device), ranks, costs)
    except Refusal as refusal:
        return {"refused": str(refusal)}, f"refused: {refusal}"
    return estimate.as_dict(), estimate.describe()


if __name__ == "__main__":
    sys.exit(main())
