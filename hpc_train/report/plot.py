"""hpc-train-report's PNG: a bar chart of every job's throughput (samples/s, or tokens/s for language models),
coloured by strategy, beside the training-loss curve of every job. It needs matplotlib, imported only here."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, List, Sequence

from hpc_train.records import rundir


def _short_label(job: Any, own: List[str], width: int = 28) -> str:
    text = " ".join(own) if own else (job.strategy or "")
    wrapped = textwrap.wrap(text, width) or [""]
    return "\n".join([f"#{job.name}" if job.name.isdigit() else job.name, *wrapped[:3]])


def write_png(jobs: Sequence[Any], common: List[str], own: List[List[str]], title: str, path: Path) -> None:
    """`jobs`: the report's rows (hpc_train.report.command.JobReport); `common`, `own`: the overrides every job
    shares and each one's own."""
    # matplotlib (optional, ~0.7 s): only for the PNG; without it the report still prints its table
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    strategies = sorted({job.strategy or "unknown" for job in jobs})
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    colour = {name: palette[i % len(palette)] for i, name in enumerate(strategies)}

    fig = Figure(figsize=(max(11.0, 4.0 + 1.4 * len(jobs)), 5.8), layout="constrained")
    FigureCanvasAgg(fig)
    bars_ax, loss_ax = fig.subplots(1, 2, width_ratios=[max(1.0, 0.5 * len(jobs)), 1.6])

    labels = [_short_label(job, mine) for job, mine in zip(jobs, own)]
    # Language models are read by tokens/s: the bars show it when every job that has a throughput has one.
    tokens = any(job.tokens_per_sec for job in jobs) and all(
        job.tokens_per_sec is not None for job in jobs if job.samples_per_sec is not None
    )
    unit = "tokens/s" if tokens else "samples/s"
    rates = [job.tokens_per_sec if tokens else job.samples_per_sec for job in jobs]
    values = [rate if rate is not None else 0.0 for rate in rates]
    positions = list(range(len(jobs)))
    bars = bars_ax.bar(
        positions, values, color=[colour[job.strategy or "unknown"] for job in jobs], edgecolor="black", linewidth=0.6
    )
    top = max(values) if any(values) else 1.0
    for bar, job, rate in zip(bars, jobs, rates):
        text = f"{rate:.0f}" if rate is not None else job.status.lower()
        bars_ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    bars_ax.set_ylim(0, top * 1.12)
    if not any(values):  # a sweep still in the queue: no scale to show, say why the bars are empty
        bars_ax.set_yticks([])
        bars_ax.text(
            0.5,
            0.5,
            "no job has completed (yet)\n(throughput comes from each job's summary.json)",
            ha="center",
            va="center",
            transform=bars_ax.transAxes,
        )
    bars_ax.set_xticks(positions, labels, fontsize=8)
    bars_ax.set_ylabel(f"throughput ({unit}, higher is better)")
    # The strategy legend sits between the title and the bars, never over a bar or its value.
    columns = min(4, len(strategies))
    legend_rows = -(-len(strategies) // columns)
    bars_ax.set_title("Training throughput per job", pad=8 + 16 * legend_rows)
    bars_ax.grid(axis="y", alpha=0.3)
    handles = [Patch(facecolor=colour[name], edgecolor="black", linewidth=0.6, label=name) for name in strategies]
    bars_ax.legend(
        handles=handles,
        title=None,
        fontsize=8,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=columns,
        frameon=False,
        handlelength=1.2,
        columnspacing=1.2,
    )

    # Jobs that train identically (e.g. ddp and single on the same global batch) draw the same
    # curve: each job gets its own line style and marker, earlier jobs drawn wider, so none hides.
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    curves = [(i, job, label) for i, (job, label) in enumerate(zip(jobs, labels)) if job.loss_curve]
    for order, (i, job, label) in enumerate(curves):
        steps, losses = zip(*job.loss_curve)
        width = 1.2 + 1.6 * (len(curves) - 1 - order) / max(1, len(curves) - 1)
        few = len(steps) <= 3  # a point or two is a marker to see, not a line to follow
        loss_ax.plot(
            steps,
            losses,
            linestyle="none" if few else styles[i % len(styles)],
            marker=markers[i % len(markers)],
            markersize=(9 if few else 3) + 2 * (len(curves) - 1 - order) / max(1, len(curves) - 1),
            linewidth=width,
            color=colour[job.strategy or "unknown"],
            alpha=0.9,
            label=label.replace("\n", " "),
        )
    if curves:
        _readable_loss_axis(loss_ax, [loss for _, job, _ in curves for _, loss in job.loss_curve])
        loss_ax.legend(
            fontsize=7, loc="best", title="job (identical runs overlap)" if len(curves) > 1 else None, title_fontsize=7
        )
    else:
        loss_ax.text(
            0.5,
            0.5,
            "no training step logged yet (metrics.jsonl)",
            ha="center",
            va="center",
            transform=loss_ax.transAxes,
        )
        loss_ax.set_xticks([])
        loss_ax.set_yticks([])
    loss_ax.set_xlabel("optimizer step")
    loss_ax.set_ylabel("train loss (trainer.loss, global batch)")
    loss_ax.set_title("Training loss per job")
    loss_ax.grid(alpha=0.3)

    lines = [f"hpc-train report: {title}"]
    if common:
        wrap = max(60, int(fig.get_figwidth() * 13))
        # One override never breaks across lines (no-break spaces inside it), so they can be counted.
        shared = textwrap.wrap("shared\u00a0overrides: " + " ".join(o.replace(" ", "\u00a0") for o in common), wrap)
        if len(shared) > 2:  # the terminal table prints them all
            shown = len(" ".join(shared[:2]).split(" ")) - 1
            shared = shared[:2] + [f"... and {len(common) - shown} more (all in the printed table's header)"]
        lines += shared
    fig.suptitle("\n".join(lines), fontsize=10)
    kept = "the table above is complete, and the previous plot (if any) is kept"
    with rundir.recording(path, kept, "free space on that file system, or pass --png /elsewhere.png or --no-png"):
        rundir.write_atomic(path, lambda handle: fig.savefig(handle, dpi=110, format="png"))


def _readable_loss_axis(ax, losses: List[float]) -> None:
    """Plain tick labels, and at least a 2 % span around the losses.

    Without this, two identical runs whose losses differ by 5e-7 get an axis in offset notation
    ("1e-7+2.3317") stretched over that difference, and look far apart.
    """
    from matplotlib.ticker import MaxNLocator  # matplotlib (optional): only for the PNG

    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps
    low, high = min(losses), max(losses)
    middle, span = (low + high) / 2, high - low
    least = 0.02 * max(abs(middle), 1e-12)
    if span < least:
        ax.set_ylim(middle - least, middle + least)
