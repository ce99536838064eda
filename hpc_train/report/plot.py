"""hpc-train-report's PNG: a bar chart of every job's throughput (samples/s, or tokens/s for language models),
coloured by strategy, beside the training-loss curve of every job. It needs matplotlib, imported only here."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Dict, List, Sequence

from hpc_train.records import rundir

_PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
_LINE_STYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


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

    colour = _strategy_colours(jobs)
    fig = Figure(figsize=(max(11.0, 4.0 + 1.4 * len(jobs)), 5.8), layout="constrained")
    FigureCanvasAgg(fig)
    bars_ax, loss_ax = fig.subplots(1, 2, width_ratios=[max(1.0, 0.5 * len(jobs)), 1.6])
    labels = [_short_label(job, mine) for job, mine in zip(jobs, own)]
    _draw_throughput(bars_ax, jobs, labels, colour)
    _draw_strategy_legend(bars_ax, colour)
    _draw_losses(loss_ax, jobs, labels, colour)
    fig.suptitle(_heading(title, common, fig.get_figwidth()), fontsize=10)
    kept = "the table above is complete, and the previous plot (if any) is kept"
    with rundir.recording(path, kept, "free space on that file system, or pass --png /elsewhere.png or --no-png"):
        rundir.write_atomic(path, lambda handle: fig.savefig(handle, dpi=110, format="png"))


def _strategy_colours(jobs: Sequence[Any]) -> Dict[str, str]:
    """Each strategy's colour, in the order of their names ("unknown" for a job whose strategy is not known)."""
    strategies = sorted({_strategy(job) for job in jobs})
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(strategies)}


def _strategy(job: Any) -> str:
    return job.strategy or "unknown"


def _draw_throughput(ax: Any, jobs: Sequence[Any], labels: List[str], colour: Dict[str, str]) -> None:
    """One bar a job, its value written above it (or the job's status where it has none)."""
    # Language models are read by tokens/s: the bars show it when every job that has a throughput has one.
    tokens = any(job.tokens_per_sec for job in jobs) and all(
        job.tokens_per_sec is not None for job in jobs if job.samples_per_sec is not None
    )
    unit = "tokens/s" if tokens else "samples/s"
    rates = [job.tokens_per_sec if tokens else job.samples_per_sec for job in jobs]
    values = [rate if rate is not None else 0.0 for rate in rates]
    positions = list(range(len(jobs)))
    bars = ax.bar(positions, values, color=[colour[_strategy(job)] for job in jobs], edgecolor="black", linewidth=0.6)
    for bar, job, rate in zip(bars, jobs, rates):
        text = f"{rate:.0f}" if rate is not None else job.status.lower()
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylim(0, (max(values) if any(values) else 1.0) * 1.12)
    if not any(values):  # a sweep still in the queue: no scale to show, say why the bars are empty
        ax.set_yticks([])
        _say_in_the_middle(ax, "no job has completed (yet)\n(throughput comes from each job's summary.json)")
    ax.set_xticks(positions, labels, fontsize=8)
    ax.set_ylabel(f"throughput ({unit}, higher is better)")
    ax.grid(axis="y", alpha=0.3)


def _draw_strategy_legend(ax: Any, colour: Dict[str, str]) -> None:
    """The strategies' colours between the bars' title and the bars, never over a bar or its value."""
    from matplotlib.patches import Patch  # matplotlib (optional): only for the PNG

    columns = min(4, len(colour))
    legend_rows = -(-len(colour) // columns)
    ax.set_title("Training throughput per job", pad=8 + 16 * legend_rows)
    handles = [Patch(facecolor=shade, edgecolor="black", linewidth=0.6, label=name) for name, shade in colour.items()]
    ax.legend(
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


def _draw_losses(ax: Any, jobs: Sequence[Any], labels: List[str], colour: Dict[str, str]) -> None:
    """Each job's training-loss curve (or a note that no step is logged yet)."""
    curves = [(i, job, label) for i, (job, label) in enumerate(zip(jobs, labels)) if job.loss_curve]
    for order, (i, job, label) in enumerate(curves):
        _draw_curve(
            ax, job, label, colour[_strategy(job)], i, wider=(len(curves) - 1 - order) / max(1, len(curves) - 1)
        )
    if curves:
        _readable_loss_axis(ax, [loss for _, job, _ in curves for _, loss in job.loss_curve])
        ax.legend(
            fontsize=7, loc="best", title="job (identical runs overlap)" if len(curves) > 1 else None, title_fontsize=7
        )
    else:
        _say_in_the_middle(ax, "no training step logged yet (metrics.jsonl)")
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("train loss (trainer.loss, global batch)")
    ax.set_title("Training loss per job")
    ax.grid(alpha=0.3)


def _draw_curve(ax: Any, job: Any, label: str, colour: str, i: int, wider: float) -> None:
    """One job's loss curve. Jobs that train identically (e.g. ddp and single on the same global batch) draw the same
    curve: each job (the `i`-th) gets its own line style and marker, earlier jobs drawn wider (`wider`: 1 for the
    first curve, 0 for the last), so none hides."""
    steps, losses = zip(*job.loss_curve)
    few = len(steps) <= 3  # a point or two is a marker to see, not a line to follow
    ax.plot(
        steps,
        losses,
        linestyle="none" if few else _LINE_STYLES[i % len(_LINE_STYLES)],
        marker=_MARKERS[i % len(_MARKERS)],
        markersize=(9 if few else 3) + 2 * wider,
        linewidth=1.2 + 1.6 * wider,
        color=colour,
        alpha=0.9,
        label=label.replace("\n", " "),
    )


def _say_in_the_middle(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _heading(title: str, common: List[str], fig_width: float) -> str:
    """The figure's title: the report's, then the overrides every job shares (at most two lines of them)."""
    lines = [f"hpc-train report: {title}"]
    if common:
        wrap = max(60, int(fig_width * 13))
        # One override never breaks across lines (no-break spaces inside it), so they can be counted.
        shared = textwrap.wrap("shared\u00a0overrides: " + " ".join(o.replace(" ", "\u00a0") for o in common), wrap)
        if len(shared) > 2:  # the terminal table prints them all
            shown = len(" ".join(shared[:2]).split(" ")) - 1
            shared = shared[:2] + [f"... and {len(common) - shown} more (all in the printed table's header)"]
        lines += shared
    return "\n".join(lines)


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
