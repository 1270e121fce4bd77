"""``logs.txt`` (docs/spec/supervisor.md §3.8): one redacted line per event, appended across invocations.

Line format: ``<UTC ISO µs Z> <LEVEL> [<step>] <message>[ <canonical JSON details>]``.
Every line passes through the :class:`~launcher.redact.Redactor` before it is written or
echoed; the file is 0600 and each line is one ``write``, not fsync'd (the journal is the
authority). A line that cannot be written (a full disk, an I/O error) never raises into the
caller: the log is cut back to its last whole line, the first such error is kept in
:attr:`RunLog.write_failure` for the run's final message, and later lines are tried again.

Child output reaches the log a line at a time, so a secret a line break cut in two (a wrapped
provider echo, a key printed in two ``print`` calls) is whole on neither line: each line of a
message also has a piece of a secret (8+ characters) at its start or end redacted
(:meth:`~launcher.redact.Redactor.redact_fragments`, with no memory of the previous line, so
nothing is held back from ``--verbose``). A line over :data:`MAX_LINE_BYTES` (one 20 MB line of
rollout output) keeps its head and tail and says how many bytes were cut; it is cut after it is
redacted, so the cut cannot leave a piece of a secret behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from launcher.redact import Redactor
from launcher.rundir.atomic import WriteFailure, fast_sorted_json

__all__ = [
    "INVOCATION_ENDED",
    "INVOCATION_STEP",
    "MAX_LINE_BYTES",
    "RUN_FAILED",
    "RunLog",
    "line_details",
    "utc_now_iso",
]

#: The ``INFO [finalize] invocation ended {"duration_ms", "started_at", "status"}`` line each
#: invocation of a run writes when it finalizes (the report sums them into the run's wall time).
INVOCATION_STEP = "finalize"
INVOCATION_ENDED = "invocation ended"

#: How an ``ERROR [run]`` line that names the error which ended an invocation begins.
RUN_FAILED = "the run stopped with an error: "

#: The longest ``logs.txt`` line, in bytes: past it the middle is cut. Long enough for any
#: traceback or details object, short enough that the file stays readable and ``tail`` works.
MAX_LINE_BYTES = 64 * 1024
# Room for the " … [cut <n> bytes] … " marker and for moving each cut to a character boundary.
_MARKER_ROOM = 64


def utc_now_iso(now: datetime | None = None, *, timespec: str = "microseconds") -> str:
    """UTC ISO-8601 with a ``Z`` suffix: ``2026-08-20T12:34:56.123456Z``.

    The one timestamp formatter of the run directory. ``timespec`` is
    :meth:`datetime.isoformat`'s: the default always writes six fractional digits (``logs.txt``,
    the manifest, ``metrics.json``, ``server.json``); ``"auto"`` drops them when the microsecond
    is 0, which is how ``tunnel.json`` has always been written.
    """
    if now is None and timespec == "microseconds":
        return _now_iso()
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


# The current second and its ``YYYY-MM-DDTHH:MM:SS``, formatted once per second rather than
# per line; one tuple, replaced whole, so a thread never pairs one second with another's text.
_second: tuple[int, str] = (-1, "")


def _now_iso() -> str:
    """The current time as :func:`utc_now_iso` writes it. ``datetime.now`` reads the same
    clock as :func:`time.time_ns` and floors it to the microsecond, as this does."""
    global _second
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _second
    if cached[0] != seconds:
        cached = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{cached[1]}.{micros:06d}Z"


def line_details(message: str, prefix: str) -> dict[str, Any] | None:
    """The details object a ``logs.txt`` message carries after ``prefix`` (``message {json}``,
    as :meth:`RunLog.log` writes it), or None when it starts otherwise or has none."""
    if not message.startswith(prefix):
        return None
    try:
        details = json.loads(message[len(prefix) :])
    except ValueError:
        return None
    return details if isinstance(details, dict) else None


def _cut(data: bytes) -> bytes:
    """``data`` (UTF-8, over :data:`MAX_LINE_BYTES`) as its head and tail around a marker
    saying how many bytes were cut, each cut on a character boundary."""
    keep = (MAX_LINE_BYTES - _MARKER_ROOM) // 2
    head = keep
    while head > 0 and data[head] & 0xC0 == 0x80:  # a continuation byte: inside a character
        head -= 1
    tail = len(data) - keep
    while tail < len(data) and data[tail] & 0xC0 == 0x80:
        tail += 1
    return data[:head] + f" … [cut {tail - head:,} bytes] … ".encode() + data[tail:]


def _details_json(details: dict[str, Any]) -> str:
    # Like canonical JSON, but never fails on odd values: logs must not crash the run.
    fast = fast_sorted_json(details)
    if fast is not None:
        return fast.decode("utf-8")
    return json.dumps(
        details, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
    )


class RunLog:
    """The run's ``logs.txt``. Thread-safe; usable as a context manager (closes on exit).

    ``echo`` (optional) receives every redacted line without its newline, for ``--verbose``;
    it can be set or replaced later through :attr:`echo`.
    """

    def __init__(
        self, path: Path, redactor: Redactor, echo: Callable[[str], None] | None = None
    ) -> None:
        self.path = Path(path)
        self.redactor = redactor
        self.echo = echo
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # We are the only writer (the run lock), so the size is tracked rather than asked for.
        self._size = os.fstat(self._fd).st_size
        self._mutex = threading.Lock()
        self.write_failure: WriteFailure | None = None
        """The first line that could not be written, if any."""

    def log(
        self, level: str, step: str, message: str, details: dict[str, Any] | None = None
    ) -> str:
        """Write one line; returns the redacted line (without newline), as written: cut to
        :data:`MAX_LINE_BYTES` when longer."""
        # Before the line is assembled: the message's own edges are where a line break may
        # have cut a secret (the timestamp and the details are never such an edge).
        message = self.redactor.redact_fragments(message)
        line = f"{utc_now_iso()} {level} [{step}] {message}"
        if details is not None:
            line += " " + _details_json(details)
        # Child output can contain newlines-in-lines (\r); keep one physical line per event.
        line = self.redactor(line.replace("\n", "\\n"))
        data = line.encode("utf-8", "backslashreplace")
        if len(data) > MAX_LINE_BYTES:
            data = _cut(data)
            line = data.decode("utf-8")
        with self._mutex:
            if self._fd >= 0:
                self._write(data + b"\n")
        if self.echo is not None:
            self.echo(line)
        return line

    def info(self, step: str, message: str, details: dict[str, Any] | None = None) -> str:
        """An ``INFO`` line."""
        return self.log("INFO", step, message, details)

    def warning(self, step: str, message: str, details: dict[str, Any] | None = None) -> str:
        """A ``WARNING`` line."""
        return self.log("WARNING", step, message, details)

    def error(self, step: str, message: str, details: dict[str, Any] | None = None) -> str:
        """An ``ERROR`` line."""
        return self.log("ERROR", step, message, details)

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if self.write_failure is None:
                self.write_failure = WriteFailure(self.path, exc)
            # A torn line would glue itself to the next one; cut the file back (best effort).
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            return
        self._size += len(data)

    def close(self) -> None:
        """Close the file (idempotent); later calls still echo but write nothing."""
        with self._mutex:
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                with contextlib.suppress(OSError):
                    # Nothing is buffered, so a failing close loses nothing: never let it
                    # replace the error that ends the run.
                    os.close(fd)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
