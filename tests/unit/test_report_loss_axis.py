"""hpc-train-report's plot: the loss axis of identical short runs is plain and wide."""

from __future__ import annotations


def test_loss_axis_of_identical_short_runs_is_plain_and_wide():
    """Two runs 5e-7 apart: no offset notation, a span of at least 2 % of the loss, so they overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from hpc_train.report.plot import _readable_loss_axis

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    losses = [2.3317030, 2.3317035]
    ax.plot([5, 5], losses, linestyle="none", marker="o")
    _readable_loss_axis(ax, losses)
    low, high = ax.get_ylim()
    assert high - low >= 0.02 * 2.3317 * 0.999
    fig.canvas.draw()  # tick labels (and an offset, if any) exist once drawn
    assert ax.yaxis.get_major_formatter().get_offset() == ""
