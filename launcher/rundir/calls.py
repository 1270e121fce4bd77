"""``calls.jsonl``: one line per model call the bridge served for the run (docs/calls.md).

Each line is a call record (:mod:`bridge.calls`) with the work item's ``row_index`` and
``run_index`` and the call's ``index`` within its rollout added. Durability follows the
journal's rule for results: a result is acknowledged only once its calls are durable, so the
run directory appends (and fsyncs, group-committed: :meth:`CallLog.append`) a result's call
lines here *before* it appends the result to the journal. A ``kill -9`` can therefore leave
call lines whose rollout has no journal record, at the end of the file (the groups being
committed): :meth:`CallLog.open` cuts them, and a torn last line, off, so a resumed run never
holds a call of an unacknowledged attempt and never holds one twice (a rollout id is used by
one attempt only).

Calls of superseded attempts (``--retry-failed``) stay in the file under their own rollout
ids: readers take a row's calls by the rollout id of its latest journal record
(:func:`read_calls`). Calls that belong to no rollout (``kind`` ``preflight`` or ``judge``)
are kept whatever the journal says. ``--fresh`` archives the file with the directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

import msgspec

from launcher.errors import LocalEvalError
from launcher.rundir.atomic import append_whole, fsync_dir
from launcher.rundir.groupcommit import GroupCommit

__all__ = [
    "CALLS_FILENAME",
    "CallLog",
    "call_totals",
    "encode_calls",
    "read_calls",
]

CALLS_FILENAME: Final = "calls.jsonl"
#: Keys that hold per-token data; left out when the run does not keep logprobs.
TOKEN_KEYS: Final = ("logprobs", "token_ids")
_BLOCK: Final = 1 << 16

_encode = msgspec.json.Encoder().encode


class _Head(msgspec.Struct):
    """The two fields open() needs of a line (msgspec skips the rest without building it)."""

    kind: str = "rollout"
    rollout_id: str | None = None


_decode_head = msgspec.json.Decoder(_Head).decode


def _line(record: dict[str, Any]) -> bytes:
    try:
        return _encode(record) + b"\n"
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
        # A lone surrogate in a token, or a value msgspec refuses: the stdlib escapes it.
        return (json.dumps(record, ensure_ascii=True, default=str) + "\n").encode("ascii")


def encode_calls(
    records: Iterable[dict[str, Any]],
    *,
    row_index: int | None = None,
    run_index: int | None = None,
    keep_tokens: bool = True,
) -> bytes:
    """The lines of ``records`` (a rollout's calls, in order), each with its ``index`` and the
    work item's indices; per-token data (:data:`TOKEN_KEYS`) left out unless ``keep_tokens``."""
    out = bytearray()
    for index, record in enumerate(records):
        line = dict(record)
        if not keep_tokens:
            for key in TOKEN_KEYS:
                line.pop(key, None)
        if line.get("kind", "rollout") == "rollout":
            line["index"] = index
            if row_index is not None:
                line["row_index"] = row_index
                line["run_index"] = run_index
        out += _line(line)
    return bytes(out)


def call_totals(records: Iterable[dict[str, Any]]) -> dict[str, int | None]:
    """A row's totals over its call records: ``calls``, ``cached_tokens``,
    ``cache_write_tokens`` and ``reasoning_tokens`` (None when no call reported that kind),
    ``retries``."""
    calls = retries = 0
    sums: dict[str, int | None] = dict.fromkeys(_SUMMED)
    for record in records:
        calls += 1
        retries += len(record.get("retries") or ())
        for key in _SUMMED:
            value = record.get(key)
            if isinstance(value, int):
                sums[key] = (sums[key] or 0) + value
    return {"calls": calls, **sums, "retries": retries}


_SUMMED = ("cached_tokens", "cache_write_tokens", "reasoning_tokens")


def _orphan_suffix(fd: int, size: int, acknowledged: Callable[[str], bool]) -> int:
    """Where the trailing run of call lines of unacknowledged rollouts starts (``size`` when
    there is none), reading the file backwards a block at a time."""
    keep_end = size
    position = size
    tail = b""
    while position > 0:
        start = max(0, position - _BLOCK)
        chunk = os.pread(fd, position - start, start) + tail
        lines = chunk.split(b"\n")
        # The first piece may be a partial line (unless the block reached the file's start).
        tail = lines.pop(0) if start > 0 else b""
        offset = start + len(tail) + (1 if start > 0 else 0)
        ends: list[tuple[int, int, bytes]] = []
        for raw in lines:
            ends.append((offset, offset + len(raw) + 1, raw))
            offset += len(raw) + 1
        for line_start, _, raw in reversed(ends):
            if not raw:
                continue
            try:
                head = _decode_head(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return keep_end
            if head.kind != "rollout" or head.rollout_id is None or acknowledged(head.rollout_id):
                return keep_end
            keep_end = line_start
        position = start
    return keep_end


def _committed_size(fd: int, size: int) -> int:
    """The size up to and including the last newline (what follows it is a torn line)."""
    position = size
    while position > 0:
        start = max(0, position - _BLOCK)
        newline = os.pread(fd, position - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


class CallLog:
    """An open ``calls.jsonl`` for append (single writer: the run directory's)."""

    def __init__(self, path: Path, fd: int, dropped: int, torn: int) -> None:
        self.path = path
        self._fd = fd
        self.dropped_bytes = dropped
        """Bytes of call lines of unacknowledged rollouts cut off at open."""
        self.torn_bytes = torn
        """Bytes of a partial last line cut off at open."""
        self._broken: str | None = None
        self._group: GroupCommit[bytes] = GroupCommit(
            lambda group: self.write_sync(b"".join(group))
        )

    @classmethod
    def open(cls, path: Path, acknowledged: Callable[[str], bool]) -> CallLog:
        """Open ``path`` for append, first cutting a torn last line and the call lines of
        rollouts ``acknowledged`` says have no journal record (see the module docstring)."""
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            committed = _committed_size(fd, size)
            keep = _orphan_suffix(fd, committed, acknowledged) if committed else 0
            if keep != size:
                os.ftruncate(fd, keep)
                os.fsync(fd)
            if not existed:
                fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, committed - keep, size - committed)

    def write_sync(self, data: bytes) -> None:
        """Write ``data`` (whole lines) in full and fsync (blocking); a failure cuts what was
        written and makes the log refuse further writes."""
        if self._broken is not None:
            raise LocalEvalError(
                f"call log {self.path} is unusable after an earlier error: {self._broken}"
            )
        if not data:
            return
        try:
            append_whole(self._fd, data)
        except OSError as exc:
            self._broken = str(exc)
            raise LocalEvalError(f"could not write call log {self.path}: {exc}") from exc

    async def append(self, data: bytes) -> None:
        """Write ``data`` (whole lines); returns once it is durable (fsync'd).

        Appends that arrive while a write is in progress are group-committed, as the journal's
        are (one write and one fsync on a worker thread per group); waiting is shielded. This
        is the first of a result's two commits (its calls, then its journal line): with a
        queue of its own, one group's calls are written while the group before it has its
        journal lines written, so the extra fsync costs latency, not throughput.
        """
        await self._group.submit(data)

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_calls(
    path: Path, rollout_ids: Iterable[str] | None = None
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The call records of ``path``: per rollout id (in call order; only ``rollout_ids`` when
    given) and, when no ids are given, the calls of no rollout (preflight, judge). A missing file reads as empty; a
    line that is not a JSON object (a torn tail a writer has not cut yet) is skipped."""
    wanted = set(rollout_ids) if rollout_ids is not None else None
    per_rollout: dict[str, list[dict[str, Any]]] = {}
    others: list[dict[str, Any]] = []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return per_rollout, others
    except OSError as exc:
        raise LocalEvalError(f"cannot read {path}: {exc.strerror or exc}") from None
    # A few ids (one item's view): only lines that hold one of them are decoded.
    needles = [i.encode() for i in wanted] if wanted is not None and len(wanted) <= 16 else None
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        if needles is not None and not any(n in raw for n in needles):
            continue
        try:
            record = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("kind", "rollout") != "rollout":
            if wanted is None:
                others.append(record)
            continue
        rollout_id = record.get("rollout_id")
        if isinstance(rollout_id, str) and (wanted is None or rollout_id in wanted):
            per_rollout.setdefault(rollout_id, []).append(record)
    for calls in per_rollout.values():
        calls.sort(key=lambda r: r.get("index", 0))
    return per_rollout, others
