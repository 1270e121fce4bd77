"""The journal's latest record per work key, stored so that a replay of a million records
stays cheap in time and memory (issue 29, item 4).

A plain ``dict`` keyed by ``(row_index, run_index)`` needs a fresh tuple per record (about
56 bytes each and most of a replay's time past the decode). :class:`LatestRecords` keeps one
table per ``run_index`` instead, indexed by the record's own ``row_index``, so building it
allocates nothing per record. A table is a list indexed by row (``None`` where no record is)
while the rows it holds are dense enough, which they are for every run but a small shard of a
large dataset: 8 bytes per row instead of a dict's 40 or so, and no dict resize holding the old
and new tables at once (measured on a 1,000,000-record replay: 40 MB of steady size, 60 MB at
the resize's peak, the margin by which the replay's peak RSS stayed under issue 29's 500 MB).
A table whose rows are sparse (a row index more than :data:`_DENSITY` times its count of
records, beyond :data:`_SLACK`) or negative is a dict. Either way it is read through the
ordinary mapping interface with ``(row_index, run_index)`` keys.
"""

from __future__ import annotations

from collections import deque
from collections.abc import ItemsView, Iterator, MutableMapping, ValuesView
from itertools import chain, compress, repeat
from operator import attrgetter, eq, is_not

from launcher.rundir.records import TerminalRecord, WorkKey

__all__ = ["LatestRecords"]

_ROW = attrgetter("row_index")
_RUN = attrgetter("run_index")

#: Up to this many distinct run indexes in one batch are split with one C-level pass each;
#: more (a run with a large ``--n``) fall back to one Python step per record.
_SPLIT_PASSES = 16

#: A list table may be at most this many times as long as its count of records (plus
#: :data:`_SLACK`): at 8 bytes a slot that stays under a dict's cost per entry.
_DENSITY = 4
_SLACK = 1024

_Table = list[TerminalRecord | None] | dict[int, TerminalRecord]


def _dense_enough(top: int, count: int) -> bool:
    """Whether a list table reaching row ``top`` for about ``count`` records is cheap."""
    return top < _DENSITY * count + _SLACK


class LatestRecords(MutableMapping[WorkKey, TerminalRecord]):
    """The latest :class:`TerminalRecord` per ``(row_index, run_index)``; a later record of a
    key replaces the earlier one. Iteration yields keys grouped by run index (in the order each
    run index first appeared), each group in row order where its table is a list and in
    first-insertion order where it is a dict."""

    __slots__ = ("_added", "_counts", "_runs")

    def __init__(self) -> None:
        self._runs: dict[int, _Table] = {}
        # Records per list table; None until counted again after a bulk add.
        self._counts: dict[int, int | None] = {}
        # Records ever put in each list table, superseded ones included: the density check's
        # count (at most the journal's own length, and free to keep).
        self._added: dict[int, int] = {}

    def add_all(self, records: list[TerminalRecord]) -> None:
        """Add ``records`` in order (the last one of a key wins)."""
        runs = set(map(_RUN, records))
        if len(runs) > _SPLIT_PASSES:
            for record in records:
                self[record.key] = record
            return
        for run in runs:
            chosen = (
                records
                if len(runs) == 1
                else list(compress(records, map(eq, map(_RUN, records), repeat(run))))
            )
            self._add_run(run, chosen)

    def _add_run(self, run: int, chosen: list[TerminalRecord]) -> None:
        rows = list(map(_ROW, chosen))
        table = self._runs.get(run)
        if table is None:
            table = self._runs[run] = []
        if isinstance(table, list):
            top = max(rows)
            added = self._added.get(run, 0) + len(rows)
            if min(rows) >= 0 and _dense_enough(top, added):
                self._added[run] = added
                if top >= len(table):
                    table.extend(repeat(None, top + 1 - len(table)))
                # One C-level pass: the last record of a row is the one left in its slot.
                deque(map(table.__setitem__, rows, chosen), maxlen=0)
                self._counts[run] = None
                return
            table = self._as_dict(run, table)
        table.update(zip(rows, chosen, strict=True))

    def _as_dict(self, run: int, table: list[TerminalRecord | None]) -> dict[int, TerminalRecord]:
        """Turn run ``run``'s list table into a dict (its rows turned out sparse)."""
        self._counts.pop(run, None)
        self._added.pop(run, None)
        new = self._runs[run] = {
            row: record for row, record in enumerate(table) if record is not None
        }
        return new

    def _count(self, run: int) -> int:
        """Records in run ``run``'s table."""
        table = self._runs.get(run)
        if table is None:
            return 0
        if isinstance(table, dict):
            return len(table)
        count = self._counts.get(run)
        if count is None:
            count = self._counts[run] = len(table) - table.count(None)
        return count

    def within(self, rows: int, runs: int) -> bool:
        """Whether every key is ``(row, run)`` with ``0 <= row < rows`` and ``0 <= run < runs``
        (checked a table at a time)."""
        for run, table in self._runs.items():
            if not 0 <= run < runs:
                return False
            if isinstance(table, list):
                # A list's rows are >= 0; its highest row is its last filled slot.
                if any(map(is_not, table[rows:], repeat(None))):
                    return False
            elif table and (min(table) < 0 or max(table) >= rows):
                return False
        return True

    def _slot(self, key: object) -> tuple[_Table, int] | None:
        """The table and row of ``key`` when it holds a record, else None."""
        if not isinstance(key, tuple) or len(key) != 2:
            return None
        row, run = key
        table = self._runs.get(run)
        if table is None:
            return None
        if isinstance(table, dict):
            return (table, row) if row in table else None
        if isinstance(row, int) and 0 <= row < len(table) and table[row] is not None:
            return table, row
        return None

    def __getitem__(self, key: WorkKey) -> TerminalRecord:
        slot = self._slot(key)
        if slot is None:
            raise KeyError(key)
        table, row = slot
        record = table[row]
        assert record is not None
        return record

    def __contains__(self, key: object) -> bool:
        return self._slot(key) is not None

    def __setitem__(self, key: WorkKey, record: TerminalRecord) -> None:
        row, run = key
        table = self._runs.get(run)
        if table is None:
            table = self._runs[run] = []
            self._counts[run] = 0
        if isinstance(table, list):
            count = self._count(run)
            if 0 <= row < len(table):
                if table[row] is None:
                    self._counts[run] = count + 1
                    self._added[run] = self._added.get(run, 0) + 1
                table[row] = record
                return
            added = self._added.get(run, 0) + 1
            if row >= 0 and _dense_enough(row, added):
                table.extend(repeat(None, row - len(table)))
                table.append(record)
                self._counts[run] = count + 1
                self._added[run] = added
                return
            table = self._as_dict(run, table)
        table[row] = record

    def __delitem__(self, key: WorkKey) -> None:
        slot = self._slot(key)
        if slot is None:
            raise KeyError(key)
        table, row = slot
        run = key[1]
        if isinstance(table, dict):
            del table[row]
        else:
            count = self._count(run)
            table[row] = None
            self._counts[run] = count - 1
        if not self._count(run):
            del self._runs[run]
            self._counts.pop(run, None)
            self._added.pop(run, None)

    def _tables(self) -> Iterator[tuple[int, Iterator[tuple[int, TerminalRecord]]]]:
        for run, table in self._runs.items():
            if isinstance(table, dict):
                yield run, iter(table.items())
            else:
                yield run, ((row, r) for row, r in enumerate(table) if r is not None)

    def __iter__(self) -> Iterator[WorkKey]:
        for run, pairs in self._tables():
            for row, _ in pairs:
                yield (row, run)

    def values(self) -> ValuesView[TerminalRecord]:
        return _Values(self)

    def items(self) -> ItemsView[WorkKey, TerminalRecord]:
        return _Items(self)

    def __len__(self) -> int:
        return sum(map(self._count, list(self._runs)))

    def __repr__(self) -> str:
        return f"LatestRecords({len(self)} keys)"


class _Values(ValuesView[TerminalRecord]):
    """The records, read straight from the per-run tables (no key lookups)."""

    _mapping: LatestRecords

    def __iter__(self) -> Iterator[TerminalRecord]:
        tables = self._mapping._runs.values()
        return chain.from_iterable(
            table.values() if isinstance(table, dict) else filter(None, table) for table in tables
        )


class _Items(ItemsView[WorkKey, TerminalRecord]):
    """The ``(key, record)`` pairs, read straight from the per-run tables."""

    _mapping: LatestRecords

    def __iter__(self) -> Iterator[tuple[WorkKey, TerminalRecord]]:
        for run, pairs in self._mapping._tables():
            for row, record in pairs:
                yield (row, run), record
