"""A table that fits a terminal's width without folding a cell: ``eval list``'s layout.

Names stay whole. When the columns do not fit, the path is cut in the middle first (its start
and its end are what tell runs apart), down to :data:`MIN_MIDDLE`; then columns are dropped in
the order given, least useful first. Pure text in, lines out (no I/O, no rich).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["GAP", "MIN_MIDDLE", "fit_table", "middle_cut"]

#: Spaces between two columns.
GAP = 2
#: The narrowest a middle-cut column is made before columns are dropped instead.
MIN_MIDDLE = 20


def middle_cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its middle replaced by ``…`` when too long."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def _widths(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]


def fit_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    *,
    drop_order: Sequence[str] = (),
    middle: Sequence[str] = (),
) -> list[str]:
    """The header line and one line per row, each at most ``width`` characters when that is
    possible without cutting a column outside ``middle`` or dropping one outside ``drop_order``
    (then the lines are as narrow as those rules allow)."""
    keep = list(range(len(columns)))
    full = _widths(columns, rows)
    widths = list(full)
    droppable = [i for name in drop_order for i, c in enumerate(columns) if c == name]
    while True:
        widths = list(full)
        excess = sum(widths[i] for i in keep) + GAP * (len(keep) - 1) - width
        for i in keep:  # cut the middle-cut columns, first one first, down to MIN_MIDDLE
            if excess <= 0:
                break
            if columns[i] in middle and widths[i] > MIN_MIDDLE:
                cut = min(excess, widths[i] - MIN_MIDDLE)
                widths[i] -= cut
                excess -= cut
        if excess <= 0:
            break
        drop = next((i for i in droppable if i in keep), None)
        if drop is None:
            break
        keep.remove(drop)

    def line(cells: Sequence[str]) -> str:
        parts = [middle_cut(cells[i], widths[i]).ljust(widths[i]) for i in keep]
        return (" " * GAP).join(parts).rstrip()

    return [line(columns), *(line(r) for r in rows)]
