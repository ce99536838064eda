"""Plain-text tables with aligned columns: the one formatter of every table hpc_train prints."""

from __future__ import annotations

from typing import Collection, Sequence


def format_table(
    header: Sequence[object], rows: Sequence[Sequence[object]], right: Collection[str] = (), rule: bool = True
) -> str:
    """Columns two spaces apart, each as wide as its widest cell; `right` names the right-aligned columns (numbers);
    `rule` draws a line of dashes under the header. Trailing spaces are stripped."""
    table = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    names = table[0]
    lines = [
        "  ".join(
            cell.rjust(w) if name in right else cell.ljust(w) for cell, w, name in zip(row, widths, names)
        ).rstrip()
        for row in table
    ]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
