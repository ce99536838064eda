"""The hang watchdog's cost per training step, measured inside one process (robust to a loaded machine).

The same small training step (an MLP, ~10 ms on a CPU core) runs in alternating blocks with the
heartbeat on (``--timeout 10``: it publishes and watches every 0.5 s, the worst case; ``--timeout auto``, the
default: every 15 s; the step makes the loop's mark() calls) and off (no heartbeat, no marks). Blocks alternate
on/off many times, so a change of the machine's load hits both sides alike; the figure is the
median over block pairs of (median step on / median step off - 1). Against the plain loop (off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from hpc_train.compute.runtime import heartbeat  # noqa: E402
from hpc_train.records import hang  # noqa: E402

MARKS = (hang.DATA, hang.FORWARD, hang.BACKWARD, hang.OPTIMIZER, hang.COLLECTIVE, hang.OPTIMIZER, hang.DATA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=60, help="steps per block")
    parser.add_argument(
        "--timeout", default="10", help="trainer.hang_timeout_s: 10 (a beat every 0.5 s) or auto (15 s)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))

    def block(marked: bool) -> float:
        times = []
        for step in range(args.steps):
            start = time.perf_counter()
            if marked:
                heartbeat.mark(MARKS[0], step + 1)
                heartbeat.mark(MARKS[1])
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if marked:
                heartbeat.mark(MARKS[2])
            optimizer.zero_grad()
            loss.backward()
            if marked:
                heartbeat.mark(MARKS[3])
                with heartbeat.phase(MARKS[4]):
                    pass
            optimizer.step()
            if marked:
                heartbeat.step_ended(time.perf_counter() - start)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    timeout = args.timeout if args.timeout == hang.AUTO else float(args.timeout)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-watchdog-"))
    (run_dir / "logs").mkdir()
    ranks = SimpleNamespace(rank=0, world_size=1, is_main=True, local_rank=0)
    block(False)  # warm-up
    ratios, on_s, off_s = [], [], []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        medians = {}
        for on in order:
            beat = (
                heartbeat.Heartbeat(run_dir, ranks, {"hang_timeout_s": timeout, "dist_timeout_s": 1800}).start()
                if on
                else None
            )
            medians[on] = block(on)
            if beat is not None:
                beat.close()
        ratios.append(medians[True] / medians[False] - 1)
        on_s.append(medians[True])
        off_s.append(medians[False])
    result = {
        "benchmark": "watchdog_inprocess",
        "config": {
            "pairs": args.pairs,
            "steps_per_block": args.steps,
            "model": "MLP 512-1024-10, batch 256, 1 thread",
            "hang_timeout_s": args.timeout,
        },
        "median_step_s_on": statistics.median(on_s),
        "median_step_s_off": statistics.median(off_s),
        "overhead": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "beat_s": heartbeat.beat_seconds(hang.timeout_s(timeout, None, 1800)),
    }
    write_result(f"watchdog_inprocess_{args.timeout}", result)
    print(
        f"median step: watchdog on {result['median_step_s_on'] * 1e3:.3f} ms, "
        f"off {result['median_step_s_off'] * 1e3:.3f} ms"
    )
    o = result["overhead"]
    print(
        f"overhead (on / off - 1), median over {args.pairs} block pairs: {o['median']:+.4f} ({o['min']:+.4f} to "
        f"{o['max']:+.4f})"
    )


if __name__ == "__main__":
    main()
