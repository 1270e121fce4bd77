"""Datasets (docs/spec/supervisor.md §5): JSONL/CSV/Parquet readers, row normalization, row selection
(``--rows``, ``limit``) and the deterministic ``dataset_rows.jsonl`` bytes.

All problems raise :class:`~launcher.errors.ValidationError` before any run directory exists.
"""

from __future__ import annotations

import bisect
import csv
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import DependencyError, ValidationError

__all__ = [
    "DatasetSelection",
    "NormalizedRow",
    "SelectedRow",
    "WorkItem",
    "compact_selector",
    "dataset_rows_jsonl",
    "file_sha256",
    "iter_raw_rows",
    "normalize_row",
    "parse_rows_selector",
    "select_rows",
]

PROMPT_MAX_CHARS = 2000
LABEL_MAX_CHARS = 500
_CSV_FIELD_LIMIT = 16 * 1024 * 1024
_TOO_DEEP = "JSON nested too deeply to read; flatten the value"
# An out-of-range --rows error lists at most this many offsets (else it shows ranges).
_LISTED_OFFSETS = 20
_ROWS_SYNTAX = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
#: The columns a row is built from (:func:`normalize_row`); a Parquet file's others are not read.
_ROW_COLUMNS = ("system_prompt", "user_prompt", "ground_truth", "label", "metadata")
_BIG_NUMBER = "holds an integer too long to read (over {digits} digits); store it as a string"


def _big_number() -> str:
    """What a JSON value is when :func:`json.loads` refuses it past a JSON syntax error: only
    an integer over Python's digit limit (a ``ValueError`` that names neither file nor line)."""
    return _BIG_NUMBER.format(digits=sys.get_int_max_str_digits())


def _messages(system_prompt: str | None, user_prompt: str | None) -> list[dict[str, str]]:
    messages = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    if user_prompt is not None:
        messages.append({"role": "user", "content": user_prompt})
    return messages


@dataclass(frozen=True, slots=True)
class NormalizedRow:
    """The columns of one dataset row that a rollout uses (§5.3)."""

    system_prompt: str | None
    user_prompt: str | None
    label: str | None
    metadata: dict[str, Any] | None

    @property
    def initial_messages(self) -> list[dict[str, str]]:
        """``[system?, user?]`` chat messages sent to the rollout."""
        return _messages(self.system_prompt, self.user_prompt)


@dataclass(frozen=True, slots=True)
class SelectedRow:
    """One selected row: ``row_index`` in the selected set, ``source_row_index`` in the file.

    The supervisor holds every selected row for the whole run, so a row keeps its two prompts
    (slots, no per-row dict) and builds its chat messages only when asked: the message dicts
    were about half of a row's memory.
    """

    row_index: int
    source_row_index: int
    system_prompt: str | None
    user_prompt: str | None
    label: str | None
    metadata: dict[str, Any] | None

    @property
    def initial_messages(self) -> list[dict[str, str]]:
        """``[system?, user?]`` chat messages sent to the rollout (a new list at each call)."""
        return _messages(self.system_prompt, self.user_prompt)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One unit of work: run ``run_index`` of a selected row."""

    row: SelectedRow
    run_index: int

    @property
    def row_index(self) -> int:
        """The row's index in the selected set."""
        return self.row.row_index

    @property
    def source_row_index(self) -> int:
        """The row's index in the dataset file."""
        return self.row.source_row_index

    @property
    def key(self) -> tuple[int, int]:
        """``(row_index, run_index)``: the journal's key for this item."""
        return (self.row.row_index, self.run_index)


@dataclass(frozen=True)
class DatasetSelection:
    """The result of reading and selecting a dataset file."""

    path: Path
    name: str
    sha256: str
    total_dataset_rows: int
    rows: list[SelectedRow]

    @property
    def selected_source_rows(self) -> str:
        """The compact selector of the selected source offsets (manifest input lock, §4.3)."""
        return compact_selector(row.source_row_index for row in self.rows)


def file_sha256(path: Path) -> str:
    """Lowercase hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def parse_rows_selector(text: str) -> list[tuple[int, int]]:
    """Parse ``--rows`` (``"3,7,10-20"``, inclusive ranges) into sorted, merged ``(lo, hi)`` ranges.

    Ranges, not offsets: a typo such as ``0-200000000`` costs one tuple here, and
    :func:`select_rows` refuses it against the dataset's real size.
    """
    value = text.strip()
    if not _ROWS_SYNTAX.match(value):
        raise ValidationError(
            f"--rows must be comma-separated indices or ranges, for example '3,7,10-20': got '{text}'"
        )
    ranges: list[tuple[int, int]] = []
    for part in value.split(","):
        lo_text, _, hi_text = part.partition("-")
        lo = int(lo_text)
        hi = int(hi_text) if hi_text else lo
        if lo > hi:
            raise ValidationError(f"--rows range '{part}' is inverted; write it as {hi}-{lo}")
        ranges.append((lo, hi))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _out_of_range(ranges: Sequence[tuple[int, int]], total: int) -> str | None:
    """The selected offsets at or past ``total``, listed when few, else as a compact selector."""
    beyond = [(max(lo, total), hi) for lo, hi in ranges if hi >= total]
    if not beyond:
        return None
    if sum(hi - lo + 1 for lo, hi in beyond) <= _LISTED_OFFSETS:
        return str([o for lo, hi in beyond for o in range(lo, hi + 1)])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in beyond)


def compact_selector(offsets: Iterable[int]) -> str:
    """Sorted unique offsets with consecutive runs as ``a-b``: ``[0,1,2,5]`` -> ``"0-2,5"``."""
    ordered = sorted(set(offsets))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValidationError(f"{path}:{lineno}: invalid JSON ({exc})") from None
            except RecursionError:
                raise ValidationError(f"{path}:{lineno}: {_TOO_DEEP}") from None
            except ValueError:
                raise ValidationError(f"{path}:{lineno}: {_big_number()}") from None
            if not isinstance(obj, dict):
                raise ValidationError(f"{path}:{lineno}: each line must be a JSON object")
            yield obj


def _iter_csv(path: Path) -> Iterator[dict[str, Any]]:
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise ValidationError(f"{path} has no CSV header row")
        try:
            for row in reader:
                row.pop(None, None)  # type: ignore[call-overload,unused-ignore]
                yield row
        except csv.Error as exc:
            # For example a field over the size limit, or a NUL byte.
            raise ValidationError(
                f"{path}: unreadable CSV after line {reader.line_num}: {exc}"
            ) from None


def _iter_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DependencyError(
            'Reading Parquet datasets requires: pip install "rollbridge[parquet]"',
            details={"missing_module": "pyarrow", "extra": "parquet"},
        ) from None
    try:
        parquet = pq.ParquetFile(path)
        # Only the columns a row is built from are read: another column (a pandas timestamp
        # with nanoseconds, which pyarrow converts only with pandas) can never fail the read.
        wanted = [name for name in parquet.schema_arrow.names if name in _ROW_COLUMNS]
        for batch in parquet.iter_batches(columns=wanted):
            if not wanted:
                yield from ({} for _ in range(batch.num_rows))
                continue
            columns = [_parquet_column(path, name, batch.column(name)) for name in wanted]
            for values in zip(*columns, strict=True):
                yield dict(zip(wanted, values, strict=True))
    except (OSError, ValueError) as exc:
        # pyarrow raises ArrowInvalid (a ValueError) / OSError for files it cannot parse.
        raise ValidationError(f"{path} is not a readable Parquet file: {exc}") from None


def _parquet_column(path: Path, name: str, column: Any) -> list[Any]:
    """``column``'s values as Python objects, or an error naming the column."""
    try:
        values: list[Any] = column.to_pylist()
    except (ValueError, TypeError, OverflowError) as exc:
        reason = str(exc).split(". ")[0]
        raise ValidationError(
            f"{path}: column '{name}' cannot be converted ({reason}); store it as a string"
        ) from None
    return values


def iter_raw_rows(path: Path, extension: str | None = None) -> Iterator[dict[str, Any]]:
    """Stream raw rows (dicts) of a ``jsonl``, ``csv`` or ``parquet`` file (§5.2).

    Blank JSONL lines are skipped and not counted. ``extension`` defaults to the file suffix.
    """
    ext = (extension or path.suffix.lstrip(".")).lower()
    try:
        if ext == "jsonl":
            yield from _iter_jsonl(path)
        elif ext == "csv":
            yield from _iter_csv(path)
        elif ext == "parquet":
            yield from _iter_parquet(path)
        else:
            raise ValidationError(
                f"{path} has extension '{ext or '(none)'}' ; expected one of ['csv', 'jsonl', 'parquet']"
            )
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path} is not valid UTF-8: {exc}") from None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    return str(value)


def _metadata(value: Any, source_index: int) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return dict(value) or None
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            return None
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"row {source_index}: metadata is not valid JSON ({exc})"
            ) from None
        except RecursionError:
            raise ValidationError(f"row {source_index}: metadata {_TOO_DEEP}") from None
        except ValueError:
            raise ValidationError(f"row {source_index}: metadata {_big_number()}") from None
        if not isinstance(parsed, dict):
            raise ValidationError(f"row {source_index}: metadata must be a JSON object")
        return parsed or None
    raise ValidationError(f"row {source_index}: metadata must be a JSON object")


def normalize_row(raw: dict[str, Any], source_index: int) -> NormalizedRow:
    """Extract ``system_prompt``, ``user_prompt``, ``ground_truth``/``label`` and ``metadata`` (§5.3)."""
    system_prompt = _text(raw.get("system_prompt"))
    user_prompt = _text(raw.get("user_prompt"))
    label = _text(raw.get("ground_truth"))
    if label is None:
        label = _text(raw.get("label"))
    if "metadata" in raw:
        metadata = _metadata(raw["metadata"], source_index)
        if user_prompt is None and metadata is None:
            raise ValidationError(
                f"row {source_index}: has no prompt and no metadata; a row needs at least a "
                "user_prompt or a non-empty 'metadata' object"
            )
    else:
        metadata = None
        if user_prompt is None:
            raise ValidationError(
                f"row {source_index}: user_prompt is required for a dataset with no 'metadata' column"
            )
        if label is None:
            raise ValidationError(
                f"row {source_index}: ground_truth (or label) is required for a dataset with no "
                "'metadata' column"
            )
    return NormalizedRow(
        system_prompt=system_prompt, user_prompt=user_prompt, label=label, metadata=metadata
    )


def select_rows(
    path: Path,
    *,
    rows: str | None = None,
    limit: int | None = None,
    name: str | None = None,
    extension: str | None = None,
) -> DatasetSelection:
    """Read ``path`` and select rows (§5.4): ``rows`` (``--rows``) wins over a positive ``limit``.

    ``row_index`` numbers the selected rows 0..S-1 in file order; ``source_row_index`` is the
    0-based offset among rows actually read.
    """
    path = Path(path)
    wanted = parse_rows_selector(rows) if rows is not None else None
    starts = [lo for lo, _ in wanted or ()]
    take = limit if (wanted is None and limit is not None and limit > 0) else None
    # Each chosen row is normalized as it is read, so the raw rows are never all held at
    # once; the first row that does not normalize is reported only after the whole file was
    # read, as before (an out-of-range --rows, or no row selected, is the error shown first).
    selected: list[SelectedRow] = []
    bad_row: ValidationError | None = None
    picked = total = 0
    for offset, raw in enumerate(iter_raw_rows(path, extension)):
        total = offset + 1
        if wanted is not None:
            at = bisect.bisect_right(starts, offset) - 1
            chosen = at >= 0 and offset <= wanted[at][1]
        else:
            chosen = take is None or offset < take
        if not chosen:
            continue
        picked += 1
        if bad_row is None:
            try:
                norm = normalize_row(raw, offset)
            except ValidationError as exc:
                bad_row = exc
                continue
            selected.append(
                SelectedRow(
                    row_index=picked - 1,
                    source_row_index=offset,
                    system_prompt=norm.system_prompt,
                    user_prompt=norm.user_prompt,
                    label=norm.label,
                    metadata=norm.metadata,
                )
            )
    display_name = name or path.name
    if wanted is not None:
        out_of_range = _out_of_range(wanted, total)
        if out_of_range is not None:
            raise ValidationError(
                f"--rows selects {out_of_range} but {display_name} has {total} rows "
                f"(valid indices are 0-{max(total - 1, 0)})"
            )
    if not picked:
        raise ValidationError(f"{path} selected no rows")
    if bad_row is not None:
        raise bad_row
    return DatasetSelection(
        path=path,
        name=display_name,
        sha256=file_sha256(path),
        total_dataset_rows=total,
        rows=selected,
    )


def dataset_rows_jsonl(selected: Sequence[SelectedRow]) -> bytes:
    """The bytes of ``dataset_rows.jsonl`` (§5.5): one line per selected row, deterministic.

    ``prompt`` is the text of the non-system messages (joined by a blank line), or the
    sorted-keys JSON of ``metadata`` when there is none, cut to 2000 characters; ``label`` is
    cut to 500 characters and omitted when absent. Lines use the index.jsonl JSON style.
    """
    lines: list[str] = []
    for row in selected:
        texts = [m["content"] for m in row.initial_messages if m.get("role") != "system"]
        if texts:
            prompt = "\n\n".join(texts)
        else:
            prompt = json.dumps(row.metadata or {}, sort_keys=True, ensure_ascii=False)
        line: dict[str, Any] = {"row_index": row.row_index, "prompt": prompt[:PROMPT_MAX_CHARS]}
        if row.label is not None:
            line["label"] = row.label[:LABEL_MAX_CHARS]
        lines.append(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n")
    return "".join(lines).encode("utf-8", "backslashreplace")
