"""The terminal-result journal ``events.jsonl`` (docs/spec/supervisor.md §3.3): the resume authority.

One canonical JSON line per terminal attempt. A result counts only once its line is written
in full and fsync'd; the last line for a ``(row_index, run_index)`` wins. Replay discards a
torn final fragment (no trailing newline) and refuses any corrupt committed line. The record
types live in :mod:`launcher.rundir.records` and are re-exported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from launcher.errors import JournalCorruptError, LocalEvalError
from launcher.rundir.atomic import append_whole, fsync_dir
from launcher.rundir.calls import CallLog
from launcher.rundir.groupcommit import GroupCommit
from launcher.rundir.latest import LatestRecords
from launcher.rundir.records import (
    ERROR_MESSAGE_LIMIT,
    ERROR_PHASES,
    STATUSES,
    ErrorInfo,
    TerminalRecord,
    WorkKey,
    bounded_text,
    validate_record,
)
from rollout_server.protocol import is_single_path_segment

__all__ = [
    "ERROR_MESSAGE_LIMIT",
    "ERROR_PHASES",
    "STATUSES",
    "ErrorInfo",
    "Journal",
    "JournalReplay",
    "TerminalRecord",
    "WorkKey",
    "bounded_text",
    "replay_journal",
    "replay_tolerant",
    "validate_record",
]

_INT_FIELDS = (
    "row_index",
    "run_index",
    "source_row_index",
    "tokens",
    "max_context_tokens",
    "retries",
    "calls",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
_FLOAT_FIELDS = ("reward", "duration_ms")
_STR_FIELDS = ("rollout_id", "error_type")
_REQUIRED = ("row_index", "run_index", "rollout_id", "status")


def _field_problem(obj: dict[str, Any]) -> str | None:
    """The §3.3 message for a decoded line that is not a valid record, else None."""
    for name in _REQUIRED:
        if obj.get(name) is None:
            return f"{name} is missing"
    for name in _INT_FIELDS:
        value = obj.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{name} must be an integer"
    for name in (*_STR_FIELDS, "status"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name} must be a string"
    for name in _FLOAT_FIELDS:
        value = obj.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"{name} must be a number"
    if obj.get("metrics") is not None and not isinstance(obj["metrics"], dict):
        return "metrics must be an object"
    problem = _error_problem(obj.get("error"))
    if problem is not None:
        return problem
    if not is_single_path_segment(obj["rollout_id"]):
        return "rollout_id must be a single path segment (no '/', '\\\\', '.' or '..')"
    if obj["status"] not in STATUSES:
        return f"status must be one of {list(STATUSES)}"
    return None


def _error_problem(error: Any) -> str | None:
    """The message for a malformed ``error`` object, else None."""
    if error is None:
        return None
    if not isinstance(error, dict):
        return "error must be an object"
    for name in ("phase", "message"):
        if not isinstance(error.get(name), str):
            return f"error.{name} must be a string"
    if error.get("type") is not None and not isinstance(error["type"], str):
        return "error.type must be a string"
    status = error.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
        return "error.status must be an integer"
    return None


@dataclass
class JournalReplay:
    """What replay found: every committed record in order, and the latest per work key."""

    records: list[TerminalRecord] = field(default_factory=list)
    latest: LatestRecords = field(default_factory=LatestRecords)
    committed_bytes: int = 0
    torn_bytes: int = 0


_DECODER = msgspec.json.Decoder(TerminalRecord)

#: Replay reads the journal this many bytes at a time: a million-record journal (about
#: 200 MB) is never in memory whole, only its decoded records are.
_READ_CHUNK = 8 << 20

_ROLLOUT_ID = attrgetter("rollout_id")


def _all_valid(records: list[TerminalRecord]) -> bool:
    """Whether every decoded record passes :func:`validate_record` (the decoder already
    checked each ``status``), checked a column at a time (one pass in C instead of a Python
    call per record). Any doubt falls back to the per-record check."""
    ids = list(map(_ROLLOUT_ID, records))
    # One string with every id between newlines answers at C speed (substring scans, no
    # per-id call and no regular expression) "no id holds a separator or a NUL, is empty or
    # starts with a dot, and no id has a ':' at all"; when some id might still be refused
    # (a '.' or ':' that may be harmless), every id gets the full check.
    joined = "\n" + "\n".join(ids) + "\n"
    if "/" in joined or "\\" in joined or "\x00" in joined or "\n\n" in joined:
        return False
    return ("\n." not in joined and ":" not in joined) or all(map(is_single_path_segment, ids))


def _slow_parse(path: Path, committed: bytes, first_line: int = 1) -> list[TerminalRecord]:
    """Line-by-line parse that names the first bad line exactly (§3.3 messages);
    ``first_line`` is the number of ``committed``'s first line in the file."""
    records: list[TerminalRecord] = []
    for lineno, raw in enumerate(committed.split(b"\n")[:-1], start=first_line):
        where = f"{path}:{lineno}"
        if not raw.strip():
            raise JournalCorruptError(f"{where}: blank journal record")
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise JournalCorruptError(f"{where}: invalid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise JournalCorruptError(f"{where}: record must be a JSON object")
        problem = _field_problem(obj)
        if problem is not None:
            raise JournalCorruptError(f"{where}: {problem}")
        known = {k: obj[k] for k in TerminalRecord.__struct_fields__ if obj.get(k) is not None}
        records.append(msgspec.convert(known, TerminalRecord))
    return records


def _parse_lines(
    path: Path, committed: memoryview, lines: int, first_line: int
) -> list[TerminalRecord]:
    """The records of ``committed`` (``lines`` whole lines): one typed decode and a column
    check when every line is valid, else the line-by-line parse that names the bad one."""
    try:
        decoded = _DECODER.decode_lines(committed)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _slow_parse(path, bytes(committed), first_line)
    # decode_lines skips blank lines, so a count mismatch means a blank line (corruption).
    if len(decoded) == lines and _all_valid(decoded):
        return decoded
    return _slow_parse(path, bytes(committed), first_line)


def replay_journal(path: Path) -> JournalReplay:
    """Read ``events.jsonl``: committed records and the torn tail size (nothing is modified).

    A missing file is an empty replay. A final fragment without ``\\n`` is torn (discarded,
    even if it parses). Any committed line that is blank, not JSON, not an object, or has a
    missing/mistyped field raises :class:`JournalCorruptError` naming ``<path>:<line>``.
    """
    replay = JournalReplay()
    try:
        with open(path, "rb") as fh:
            carry = b""
            lineno = 1
            while block := fh.read(_READ_CHUNK):
                data = carry + block if carry else block
                end = data.rfind(b"\n") + 1
                carry = data[end:]
                if not end:
                    continue
                lines = data.count(b"\n", 0, end)
                # A view, not a slice: the chunk is not copied once more.
                records = _parse_lines(path, memoryview(data)[:end], lines, lineno)
                lineno += lines
                replay.committed_bytes += end
                replay.records += records
                # The last record of a key wins, across and within chunks.
                replay.latest.add_all(records)
    except FileNotFoundError:
        return JournalReplay()
    except OSError as exc:
        raise LocalEvalError(f"cannot read {path}: {exc}") from None
    replay.torn_bytes = len(carry)
    return replay


def replay_tolerant(path: Path) -> tuple[Mapping[WorkKey, TerminalRecord], str | None]:
    """The latest record per work key for a view (a listing, the daemon), and where and why
    the journal is corrupt (``at line N: …``, its first bad line) or None. Bad
    lines are skipped here; resuming still refuses them (:func:`replay_journal`)."""
    try:
        return replay_journal(path).latest, None
    except JournalCorruptError as exc:
        # "<path>:<line>: <what>" -> "at line <line>: <what>"
        where, _, what = exc.message.removeprefix(f"{path}:").partition(": ")
        problem = f"at line {where}: {what}" if where.isdigit() else exc.message
    latest: dict[WorkKey, TerminalRecord] = {}
    try:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):
                    break  # a torn tail
                try:
                    records = _slow_parse(path, raw, lineno)
                except JournalCorruptError:
                    continue
                for record in records:
                    latest[record.key] = record
    except OSError:
        pass
    return latest, problem


@dataclass(eq=False)
class _Pending:
    """A record waiting in :meth:`Journal.append`'s group-commit queue."""

    record: TerminalRecord
    line: bytes
    then: Callable[[], None] | None = None
    then_error: BaseException | None = None


class Journal:
    """An open ``events.jsonl``: durable appends and the in-memory latest-record map.

    Open it with :meth:`open` while holding the run lock (single writer). Use
    :meth:`append` from trio code: appends that arrive while a write is in progress are
    group-committed (one write and one fsync on a worker thread for the whole group, followed
    on that same thread by each record's ``then`` work, so a group costs one thread hand-off);
    :meth:`append_sync` is the blocking single-record form. A record is added to
    :attr:`latest` only after the fsync covering it returned. After a failed append the
    journal refuses further appends, because a half-written line could otherwise be followed
    by good ones.
    """

    def __init__(self, path: Path, fd: int, replay: JournalReplay) -> None:
        self.path = path
        self._fd = fd
        self.records: list[TerminalRecord] = replay.records
        self.latest: LatestRecords = replay.latest
        self.torn_bytes = replay.torn_bytes
        self._group: GroupCommit[_Pending] = GroupCommit(self._commit_group)
        self._broken: str | None = None
        self.call_log: CallLog | None = None
        """``calls.jsonl``, whose lines a result's writer makes durable before appending the
        result here (launcher.rundir.calls)."""

    @classmethod
    def open(cls, path: Path, *, on_torn: Callable[[int], None] | None = None) -> Journal:
        """Replay ``path``, cut a torn tail (calling ``on_torn(bytes)``), open it for append."""
        path = Path(path)
        replay = replay_journal(path)
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if replay.torn_bytes:
                os.ftruncate(fd, replay.committed_bytes)
                os.fsync(fd)
                if on_torn is not None:
                    on_torn(replay.torn_bytes)
            if not existed:
                fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, replay)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise LocalEvalError(
                f"journal {self.path} is unusable after an earlier error: {self._broken}"
            )

    def _commit_group(self, group: list[_Pending]) -> None:
        """Commit ``group`` (:meth:`_commit_sync`), then run each record's ``then`` in order;
        a failing ``then`` is kept for its own caller (its record still counts)."""
        self._commit_sync([p.record for p in group], b"".join(p.line for p in group))
        for p in group:
            if p.then is not None:
                try:
                    p.then()
                except BaseException as exc:
                    p.then_error = exc

    def _commit_sync(self, records: list[TerminalRecord], data: bytes) -> None:
        """Write ``data`` (the lines of ``records``) in full, fsync once, then count them."""
        self._check_usable()
        try:
            append_whole(self._fd, data)  # a failure drops the partial lines: still replayable
        except OSError as exc:
            self._broken = str(exc)
            raise LocalEvalError(f"could not write journal {self.path}: {exc}") from exc
        for record in records:
            self.records.append(record)
            self.latest[record.key] = record

    def append_sync(self, record: TerminalRecord) -> None:
        """Write ``record``'s line in full, fsync, then count it (blocking)."""
        self._check_usable()
        self._commit_sync([record], record.to_line())

    async def append(self, record: TerminalRecord, then: Callable[[], None] | None = None) -> None:
        """Append ``record``; returns once it is durable (fsync'd) and counted.

        ``then``, when given, is blocking work for after the commit (the record's projections):
        it runs on the committing worker thread right after the fsync, and what it raises is
        raised here (the record counts all the same). It is not run when the commit failed.

        The first caller while no write is in progress commits, on a worker thread, every
        record queued by then; callers arriving meanwhile queue up and the next of them
        commits the whole queue with one write and one fsync (group commit). Waiting is
        shielded and the thread is never abandoned, so a record is never half-counted and
        a caller never returns before the fsync covering its record.
        """
        self._check_usable()
        pending = _Pending(record, record.to_line(), then)
        await self._group.submit(pending)
        if pending.then_error is not None:
            raise pending.then_error

    def attach_call_log(self, path: Path) -> CallLog:
        """Open ``path`` as :attr:`call_log`, cutting the calls of rollouts no record of this
        journal acknowledges off its end (launcher.rundir.calls)."""
        ids: set[str] | None = None

        def acknowledged(rollout_id: str) -> bool:
            nonlocal ids
            if ids is None:  # built only when the file's last line is not acknowledged
                ids = {record.rollout_id for record in self.records}
            return rollout_id in ids

        self.call_log = CallLog.open(path, acknowledged)
        return self.call_log

    def close(self) -> None:
        """Close the file descriptor and the call log (idempotent)."""
        if self.call_log is not None:
            self.call_log.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
