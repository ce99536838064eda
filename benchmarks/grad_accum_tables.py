"""The tables of benchmarks/grad_accum.py's result: the rows the benchmarks docs record, and the table it prints."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    fmt_stats,
    row,
)  # noqa: E402

# The sides of the benchmark, and their names in the tables.
SIDES = ("hpc", "plain_sync", "plain_nosync")
CONTROL = (
    "plain_nosync_ctl"  # --control-side: the no_sync loop plus hpc-train's per-step 8-byte all-reduce (diagnostic)
)
NAMES = {
    CONTROL: "plain DDP with no_sync + a control all-reduce a step",
    "hpc": "hpc-train ddp, grad_accum_steps={accum}",
    "plain_sync": "plain DDP, accumulation without no_sync",
    "plain_nosync": "plain DDP, accumulation with no_sync",
}


def _count(result: dict, side: str) -> str:
    if "grad_all_reduces_per_step" not in result:
        return "-"
    c = result["grad_all_reduces_per_step"][side]
    return f"{c['min']:g}" if c["min"] == c["max"] else f"{c['min']:g}-{c['max']:g}"


def rows(result: dict) -> list:
    c = result["config"]
    s, r = result["median_step_ms"], result["ratio_sync_over_nosync"]
    h = result["ratio_sync_over_hpc"]
    return [
        row(
            "grad accum",
            f"plain DDP 2 proc, accum {c['grad_accum_steps']} without no_sync ({_count(result, 'plain_sync')} "
            "all-reduces/step)",
            s["plain_sync"],
            f"same with no_sync ({_count(result, 'plain_nosync')} all-reduces/step)",
            s["plain_nosync"],
            f"ratio {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})",
            "ms/step",
        ),
        row(
            "grad accum",
            f"plain DDP without no_sync ({_count(result, 'plain_sync')} all-reduces/step)",
            s["plain_sync"],
            f"hpc-train ddp grad_accum_steps={c['grad_accum_steps']} ({_count(result, 'hpc')} all-reduces/step)",
            s["hpc"],
            f"ratio {h['median']:.2f} ({h['min']:.2f}-{h['max']:.2f})",
            "ms/step",
        ),
    ]


def print_table(result: dict) -> None:
    c = result["config"]
    print(
        f"toy_mlp {c['parameters'] / 1e6:.2f} M parameters, global batch {c['global_batch']}, {c['world_size']} "
        "ranks x 1 thread (gloo), "
        f"grad_accum_steps={c['grad_accum_steps']} (micro-batch {c['micro_batch_per_rank']} a rank), "
        f"{c['repeats']} rounds x {c['steps']} steps ({c['warmup']} warm-up)"
    )
    head = [
        "side",
        "ms/step median (min-max)",
        "grad all-reduces/step",
        "MB all-reduced/step",
        "other all-reduces/step",
        "summary ms/step",
    ]
    body = []
    for side in c.get("sides", SIDES):
        mb = result.get("grad_mb_per_step", {}).get(side)
        other = result.get("other_all_reduces_per_step", {}).get(side)
        body.append(
            [
                NAMES[side].format(accum=c["grad_accum_steps"]),
                fmt_stats(result["median_step_ms"][side], 1),
                _count(result, side),
                "-"
                if not mb
                else (f"{mb['min']:.1f}" if mb["min"] == mb["max"] else f"{mb['min']:.1f}-{mb['max']:.1f}"),
                "-" if not other else f"{other['mean']:.2f}",
                fmt_stats(result["summary_step_ms"][side], 1),
            ]
        )
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    for line in [head, ["-" * w for w in widths], *body]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)))
    print(f"step time, without no_sync / with no_sync (plain loops): {fmt_stats(result['ratio_sync_over_nosync'], 3)}")
    print(f"step time, plain without no_sync / hpc-train:            {fmt_stats(result['ratio_sync_over_hpc'], 3)}")
    print(f"step time, hpc-train / plain with no_sync:               {fmt_stats(result['ratio_hpc_over_nosync'], 3)}")
    if "ratio_control_over_nosync" in result:
        print(
            "step time, no_sync loop + control all-reduce / no_sync loop: "
            f"{fmt_stats(result['ratio_control_over_nosync'], 3)}"
        )
        print(
            "step time, hpc-train / no_sync loop + control all-reduce:     "
            f"{fmt_stats(result['ratio_hpc_over_control'], 3)}"
        )
    if "counting_runs" in result:
        print(
            "with the counting hook (one run each, not in the figures above): "
            + ", ".join(
                f"{side} {result['counting_runs'][side]['median_step_ms']:.1f} ms/step"
                for side in c.get("sides", SIDES)
            )
        )
    if "hpc_count_equals_no_sync_loop" in result:
        print(
            "hpc-train's gradient all-reduces per step equal the no_sync loop's: "
            f"{result['hpc_count_equals_no_sync_loop']}"
        )
