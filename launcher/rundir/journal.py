"""The terminal-result journal ``events.jsonl`` (docs/spec/supervisor.md §3.3): the resume authority.

One canonical JSON line per terminal attempt. A result counts only once its line is written
in full and fsync'd; the last line for a ``(row_index, run_index)`` wins. Replay discards a
torn final fragment (no trailing newline) and refuses any corrupt committed line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio

from launcher.errors import JournalCorruptError, LocalEvalError
from launcher.rundir.atomic import canonical_json, fsync_dir
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
    "validate_record",
]

STATUSES = ("failed", "skipped", "success")
WorkKey = tuple[int, int]
_INT_FIELDS = (
    "row_index",
    "run_index",
    "source_row_index",
    "tokens",
    "max_context_tokens",
    "retries",
)
_FLOAT_FIELDS = ("reward", "duration_ms")
_STR_FIELDS = ("rollout_id", "error_type")
_REQUIRED = ("row_index", "run_index", "rollout_id", "status")

#: Where a failure happened: the workflow, the grader, the model bridge or provider, the
#: rollout server itself, the link to it (transport), its refusal to take the row, or
#: ``rollout`` when the server reported a failure without saying where (a reference server).
ERROR_PHASES = ("agent", "grader", "bridge", "server", "transport", "admission", "rollout")
#: A failure message is cut to this many UTF-8 bytes once redacted (the journal stays small,
#: and a runaway exception text cannot fill the disk one row at a time).
ERROR_MESSAGE_LIMIT = 2048


def bounded_text(text: str, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    """``text`` with lone surrogates spelled ``\\udXXX``, cut to ``limit`` UTF-8 bytes
    (never inside a character), with ``…`` marking a cut."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - 3].decode("utf-8", "ignore") + "…"


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Why an attempt failed: the journal's optional ``error`` object.

    ``phase`` is one of :data:`ERROR_PHASES`; ``type`` the exception class name when one is
    known; ``message`` the (redacted, bounded) text; ``status`` an HTTP status when the failure
    was an HTTP answer (a provider error relayed by the bridge, a refused admission).
    """

    phase: str
    message: str
    type: str | None = None
    status: int | None = None

    def with_detail(self, detail: dict[str, Any] | None) -> ErrorInfo:
        """This reason completed by what the rollout server recorded about the failure (the
        ``failure`` object of its ``diagnostics.json``); fields of the wrong kind are ignored."""
        if not detail:
            return self
        phase, kind = detail.get("phase"), detail.get("type")
        status, message = detail.get("status"), detail.get("message")
        return ErrorInfo(
            phase=phase if phase in ERROR_PHASES else self.phase,
            message=message if isinstance(message, str) and message else self.message,
            type=kind if isinstance(kind, str) and kind else self.type,
            status=(
                status if isinstance(status, int) and not isinstance(status, bool) else self.status
            ),
        )

    def redacted(self, redact: Callable[[str], str]) -> ErrorInfo:
        """A copy with ``type`` and ``message`` redacted, then bounded (in that order, so a
        cut can never leave part of a secret that redaction would have matched whole)."""
        return ErrorInfo(
            phase=self.phase,
            message=bounded_text(redact(self.message)),
            type=bounded_text(redact(self.type), 200) if self.type else None,
            status=self.status,
        )

    def describe(self, limit: int | None = None) -> str:
        """One line for people: ``agent: ValueError: <message>``, ``bridge: HTTP 502: …``;
        whitespace runs (newlines included) become one space, and ``limit`` cuts the message
        to that many characters."""
        parts = [self.phase]
        if self.type:
            parts.append(self.type)
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        head = ": ".join(parts)
        message = " ".join(self.message.split())
        if limit is not None and len(message) > limit:
            message = message[: max(limit - 1, 0)] + "…"
        return f"{head}: {message}" if message else head

    def to_json(self) -> dict[str, Any]:
        """The JSON object (absent fields left out)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class TerminalRecord(msgspec.Struct, kw_only=True):
    """One terminal attempt of a work item, as journaled.

    ``tokens`` is the sum of the rollout's model-call usage and ``max_context_tokens`` the
    largest single call (prompt + completion), both from the bridge; None when unknown.
    ``duration_ms`` is wall time from dispatch start. ``error_type`` is set for failures (the
    reference's category); ``error`` says why, where known (an addition of ours: readers that
    do not know it ignore it).
    """

    row_index: int
    run_index: int
    rollout_id: str
    status: str
    source_row_index: int | None = None
    reward: float | None = None
    tokens: int | None = None
    max_context_tokens: int | None = None
    retries: int | None = None
    """Model calls the bridge made again after a transient provider fault (ours; None: none)."""
    duration_ms: float | None = None
    error_type: str | None = None
    error: ErrorInfo | None = None

    @property
    def key(self) -> WorkKey:
        """``(row_index, run_index)``."""
        return (self.row_index, self.run_index)

    def to_dict(self) -> dict[str, Any]:
        """The journal fields with None omitted (``duration_ms`` always present, default 0.0).

        A non-finite reward (NaN, infinity) is left out: JSON cannot hold it, and losing the
        whole result over it would be worse than recording the attempt as ungraded.
        """
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, ErrorInfo):
                out[name] = value.to_json()
            elif value is not None:
                out[name] = value
        duration = float(self.duration_ms or 0.0)
        out["duration_ms"] = duration if math.isfinite(duration) else 0.0
        out.pop("reward", None)
        if self.reward is not None and math.isfinite(float(self.reward)):
            out["reward"] = float(self.reward)
        return out

    def to_line(self) -> bytes:
        """The canonical JSON line (sorted keys, compact, UTF-8, NaN refused) with ``\\n``."""
        validate_record(self)
        return (canonical_json(self.to_dict()) + "\n").encode("utf-8", "backslashreplace")


def validate_record(record: TerminalRecord) -> None:
    """Raise ValueError when ``record`` could not be replayed (used before appending)."""
    if record.status not in STATUSES:
        raise ValueError(f"status must be one of {list(STATUSES)}")
    if not is_single_path_segment(record.rollout_id):
        raise ValueError("rollout_id must be a single path segment")


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
    latest: dict[WorkKey, TerminalRecord] = field(default_factory=dict)
    committed_bytes: int = 0
    torn_bytes: int = 0


_DECODER = msgspec.json.Decoder(TerminalRecord)


def _slow_parse(path: Path, committed: bytes) -> list[TerminalRecord]:
    """Line-by-line parse that names the first bad line exactly (§3.3 messages)."""
    records: list[TerminalRecord] = []
    for lineno, raw in enumerate(committed.split(b"\n")[:-1], start=1):
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


def replay_journal(path: Path) -> JournalReplay:
    """Read ``events.jsonl``: committed records and the torn tail size (nothing is modified).

    A missing file is an empty replay. A final fragment without ``\\n`` is torn (discarded,
    even if it parses). Any committed line that is blank, not JSON, not an object, or has a
    missing/mistyped field raises :class:`JournalCorruptError` naming ``<path>:<line>``.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return JournalReplay()
    except OSError as exc:
        raise LocalEvalError(f"cannot read {path}: {exc}") from None
    end = data.rfind(b"\n") + 1
    committed = data[:end]
    replay = JournalReplay(committed_bytes=end, torn_bytes=len(data) - end)
    records: list[TerminalRecord] | None = None
    try:
        decoded = _DECODER.decode_lines(committed)
        # decode_lines skips blank lines, so a count mismatch means a blank line (corruption).
        if len(decoded) == committed.count(b"\n") and all(
            r.status in STATUSES and is_single_path_segment(r.rollout_id) for r in decoded
        ):
            records = decoded
    except (msgspec.DecodeError, msgspec.ValidationError):
        records = None
    if records is None:
        records = _slow_parse(path, committed)
    replay.records = records
    latest = replay.latest
    for record in records:
        latest[(record.row_index, record.run_index)] = record
    return replay


@dataclass(eq=False)
class _Pending:
    """A record waiting in :meth:`Journal.append`'s group-commit queue."""

    record: TerminalRecord
    line: bytes
    turn: trio.Event = field(default_factory=trio.Event)
    done: bool = False
    error: BaseException | None = None


class Journal:
    """An open ``events.jsonl``: durable appends and the in-memory latest-record map.

    Open it with :meth:`open` while holding the run lock (single writer). Use
    :meth:`append` from trio code: appends that arrive while a write is in progress are
    group-committed (one write and one fsync on a worker thread for the whole group);
    :meth:`append_sync` is the blocking single-record form. A record is added to
    :attr:`latest` only after the fsync covering it returned. After a failed append the
    journal refuses further appends, because a half-written line could otherwise be followed
    by good ones.
    """

    def __init__(self, path: Path, fd: int, replay: JournalReplay) -> None:
        self.path = path
        self._fd = fd
        self.records: list[TerminalRecord] = replay.records
        self.latest: dict[WorkKey, TerminalRecord] = replay.latest
        self.torn_bytes = replay.torn_bytes
        self._queue: list[_Pending] = []
        self._committing = False
        self._broken: str | None = None

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

    def _commit_sync(self, records: list[TerminalRecord], data: bytes) -> None:
        """Write ``data`` (the lines of ``records``) in full, fsync once, then count them."""
        self._check_usable()
        size_before = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            self._broken = str(exc)
            # Best effort: drop the partial lines so the file stays replayable.
            try:
                os.ftruncate(self._fd, size_before)
                os.fsync(self._fd)
            except OSError:
                pass
            raise LocalEvalError(f"could not write journal {self.path}: {exc}") from exc
        for record in records:
            self.records.append(record)
            self.latest[record.key] = record

    def append_sync(self, record: TerminalRecord) -> None:
        """Write ``record``'s line in full, fsync, then count it (blocking)."""
        self._check_usable()
        self._commit_sync([record], record.to_line())

    async def append(self, record: TerminalRecord) -> None:
        """Append ``record``; returns once it is durable (fsync'd) and counted.

        The first caller while no write is in progress commits, on a worker thread, every
        record queued by then; callers arriving meanwhile queue up and the next of them
        commits the whole queue with one write and one fsync (group commit). Waiting is
        shielded and the thread is never abandoned, so a record is never half-counted and
        a caller never returns before the fsync covering its record.
        """
        self._check_usable()
        pending = _Pending(record, record.to_line())
        self._queue.append(pending)
        with trio.CancelScope(shield=True):
            if self._committing:
                await pending.turn.wait()
            if not pending.done:
                await self._commit_queue()
        if pending.error is not None:
            raise pending.error

    async def _commit_queue(self) -> None:
        """Commit the queued records as one group, then hand over to the next queued caller."""
        self._committing = True
        group, self._queue = self._queue, []
        error: BaseException | None = None
        try:
            await trio.to_thread.run_sync(
                self._commit_sync, [p.record for p in group], b"".join(p.line for p in group)
            )
        except BaseException as exc:
            error = exc  # every caller of the group learns that its record did not count
        finally:
            for p in group:
                p.done = True
                p.error = error
                p.turn.set()
            self._committing = False
            if self._queue:
                # The next caller in line commits everything queued during this write.
                self._queue[0].turn.set()
                self._committing = True

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
