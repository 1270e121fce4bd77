"""The journal's latest record per work key, stored so that a replay of a million records
stays cheap (issue 29, item 4).

A plain ``dict`` keyed by ``(row_index, run_index)`` needs a fresh tuple per record (about
56 bytes each and most of a replay's time past the decode). :class:`LatestRecords` keeps one
``row_index -> record`` table per ``run_index`` instead, keyed by the record's own
``row_index`` object, so building it allocates nothing per record; it is read through the
ordinary mapping interface with ``(row_index, run_index)`` keys.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, MutableMapping, ValuesView
from itertools import chain, compress, repeat
from operator import attrgetter, eq

from launcher.rundir.records import TerminalRecord, WorkKey

__all__ = ["LatestRecords"]

_ROW = attrgetter("row_index")
_RUN = attrgetter("run_index")

#: Up to this many distinct run indexes in one batch are split with one C-level pass each;
#: more (a run with a large ``--n``) fall back to one Python step per record.
_SPLIT_PASSES = 16


class LatestRecords(MutableMapping[WorkKey, TerminalRecord]):
    """The latest :class:`TerminalRecord` per ``(row_index, run_index)``; a later record of a
    key replaces the earlier one. Iteration yields keys grouped by run index, each group in
    first-insertion order of its rows."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[int, dict[int, TerminalRecord]] = {}

    def add_all(self, records: list[TerminalRecord]) -> None:
        """Add ``records`` in order (the last one of a key wins)."""
        runs = set(map(_RUN, records))
        if len(runs) > _SPLIT_PASSES:
            for record in records:
                self._runs.setdefault(record.run_index, {})[record.row_index] = record
            return
        for run in runs:
            chosen = (
                records
                if len(runs) == 1
                else list(compress(records, map(eq, map(_RUN, records), repeat(run))))
            )
            self._runs.setdefault(run, {}).update(zip(map(_ROW, chosen), chosen, strict=True))

    def within(self, rows: int, runs: int) -> bool:
        """Whether every key is ``(row, run)`` with ``0 <= row < rows`` and ``0 <= run < runs``
        (checked a table at a time)."""
        return all(
            0 <= run < runs and (not table or (min(table) >= 0 and max(table) < rows))
            for run, table in self._runs.items()
        )

    def __getitem__(self, key: WorkKey) -> TerminalRecord:
        row, run = key
        try:
            return self._runs[run][row]
        except KeyError:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        rows = self._runs.get(key[1])
        return rows is not None and key[0] in rows

    def __setitem__(self, key: WorkKey, record: TerminalRecord) -> None:
        row, run = key
        self._runs.setdefault(run, {})[row] = record

    def __delitem__(self, key: WorkKey) -> None:
        row, run = key
        try:
            rows = self._runs[run]
            del rows[row]
        except KeyError:
            raise KeyError(key) from None
        if not rows:
            del self._runs[run]

    def __iter__(self) -> Iterator[WorkKey]:
        for run, rows in self._runs.items():
            for row in rows:
                yield (row, run)

    def values(self) -> ValuesView[TerminalRecord]:
        return _Values(self)

    def items(self) -> ItemsView[WorkKey, TerminalRecord]:
        return _Items(self)

    def __len__(self) -> int:
        return sum(map(len, self._runs.values()))

    def __repr__(self) -> str:
        return f"LatestRecords({len(self)} keys)"


class _Values(ValuesView[TerminalRecord]):
    """The records, read straight from the per-run tables (no key lookups)."""

    _mapping: LatestRecords

    def __iter__(self) -> Iterator[TerminalRecord]:
        return chain.from_iterable(rows.values() for rows in self._mapping._runs.values())


class _Items(ItemsView[WorkKey, TerminalRecord]):
    """The ``(key, record)`` pairs, read straight from the per-run tables."""

    _mapping: LatestRecords

    def __iter__(self) -> Iterator[tuple[WorkKey, TerminalRecord]]:
        for run, rows in self._mapping._runs.items():
            for row, record in rows.items():
                yield (row, run), record
