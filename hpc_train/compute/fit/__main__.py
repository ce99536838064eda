"""``python -m hpc_train.compute.fit SPEC [SPEC ...] [--ranks 0,2] [--json] [--workers N] [--device gpu|cpu]``: job
specs' memory estimates in a process of their own, each from a job spec that hpc-train writes
(``<run dir>/job_config.yaml``), for ranks on GPUs (the default: what the memory check asks) or on CPUs
(``--device cpu``: as the estimate's comparison with CPU runs measures). The login side, which never imports torch,
runs this when an estimate is asked for (a job and the layouts it suggests, in one go) and reads its output.

One spec: prints its estimate (``--json``: one JSON object) and exits EXIT_OK; a job the estimate cannot simulate
prints one line on stderr (``hpc-train: <what, and the fix>``) and exits EXIT_REFUSED.

Several specs: each is estimated (``--workers N``: its ranks in N processes at once; default 1, in this one), and the
answers are printed in the order of the specs, one per spec; the exit code is EXIT_OK, refusals included.
``--budgets B1,B2,...`` (bytes, one per spec: the tensors its GPU can hold) answers a spec whose floor is over its
budget with the floor, unsimulated; ``--enough K`` stops once K specs fit their budgets, the others answered
skipped (:mod:`hpc_train.compute.fit.batch`). With ``--json`` each answer is one line holding one JSON object:

* an estimate: ``hpc_train.compute.fit.breakdown.JobEstimate.as_dict``, ``{"layout": "<the layout in words>",
  "seconds": <to estimate>, "ranks": [{"rank", "stage", "coordinates", "parameters", "gradients",
  "optimizer_state", "activations", "temporaries", "transient", "inputs", "peak", ...}, ...], "floor": false}``
  (bytes; one entry per rank estimated), or the floor (``"floor": true``, one rank's share, not simulated);
* a spec it cannot estimate: ``{"refused": "<the one-line message, without the hpc-train: prefix>"}``;
* a spec left once enough fit: ``{"skipped": "<why>"}``.

``--serve``: one process for several calls (the login side's session: a job, then its refusal's settings). Each line
read from stdin is a request (``{"paths": [...], "budgets": [...], "enough": K, "workers": N, ...}``); its answers
are printed as JSON lines as above, one per spec, in order; the process ends with its input.

Without ``--json`` each answer is the spec's path on a line, then its estimate in words or ``refused: <message>``.
A failure other than a refusal (a crash of the user's code, say) ends the process with its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, List, Optional

from hpc_train.compute.fit.batch import Request, answers
from hpc_train.compute.fit.estimate import DEVICES
from hpc_train.records.rundir import EXIT_OK, EXIT_REFUSED


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.serve:
        return serve(sys.stdin)
    if not args.specs:
        raise SystemExit("give job specs to estimate, or --serve")
    request = Request(
        args.specs,
        [int(rank) for rank in args.ranks.split(",")] if args.ranks else None,
        max(1, args.workers),
        args.costs,
        args.device,
        [int(b) for b in args.budgets.split(",")] if args.budgets else None,
        args.enough,
    )
    if request.budgets is not None and len(request.budgets) != len(request.paths):
        raise SystemExit(f"--budgets: {len(request.budgets)} given for {len(request.paths)} spec(s)")
    given = answers(request)
    if len(given) == 1 and "refused" in given[0][0]:
        print(f"hpc-train: {given[0][0]['refused']}", file=sys.stderr)
        return EXIT_REFUSED
    for path, (data, words) in zip(args.specs, given):
        if args.json:
            print(json.dumps(data), flush=True)
        else:
            print(words if len(given) == 1 else f"{path}\n{words}", flush=True)
    return EXIT_OK


def serve(lines: Iterable[str]) -> int:
    """Requests read one a line (``batch.Request``'s fields as a JSON object), each spec's answer printed as a JSON
    line in order; until the input ends. The floors, batches and specs read are kept from one request to the next."""
    for line in lines:
        if line.strip():
            for data, _words in answers(Request(**json.loads(line)), forks_again=True):
                print(json.dumps(data), flush=True)
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.compute.fit", description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", metavar="spec", help="a job spec (a run dir's job_config.yaml)")
    parser.add_argument("--ranks", help="the ranks to estimate, e.g. 0,2 (default: the first of each pipeline stage)")
    parser.add_argument("--json", action="store_true", help="print each estimate as one JSON object, one a line")
    parser.add_argument("--workers", type=int, default=1, help="estimate the ranks in this many processes")
    parser.add_argument("--costs", action="store_true", help="count each rank's step costs too (one step more)")
    parser.add_argument("--device", choices=DEVICES, default=DEVICES[0], help="where the job's ranks run")
    parser.add_argument("--budgets", help="bytes of tensors each spec's GPU holds: a floor over it is not simulated")
    parser.add_argument("--enough", type=int, help="stop once this many specs fit their budgets")
    parser.add_argument("--serve", action="store_true", help="answer requests read from stdin, one a line (JSON)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
