"""``logs.txt`` (docs/spec/supervisor.md §3.8): one redacted line per event, appended across invocations.

Line format: ``<UTC ISO µs Z> <LEVEL> [<step>] <message>[ <canonical JSON details>]``.
Every line passes through the :class:`~launcher.redact.Redactor` before it is written or
echoed; the file is 0600 and written with flush, not fsync (the journal is the authority).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from launcher.redact import Redactor

__all__ = ["RunLog", "utc_now_iso"]


def utc_now_iso(now: datetime | None = None, *, timespec: str = "microseconds") -> str:
    """UTC ISO-8601 with a ``Z`` suffix: ``2026-08-20T12:34:56.123456Z``.

    The one timestamp formatter of the run directory. ``timespec`` is
    :meth:`datetime.isoformat`'s: the default always writes six fractional digits (``logs.txt``,
    the manifest, ``metrics.json``, ``server.json``); ``"auto"`` drops them when the microsecond
    is 0, which is how ``tunnel.json`` has always been written.
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def _details_json(details: dict[str, Any]) -> str:
    # Like canonical JSON, but never fails on odd values: logs must not crash the run.
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
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._fh = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")
        self._mutex = threading.Lock()

    def log(
        self, level: str, step: str, message: str, details: dict[str, Any] | None = None
    ) -> str:
        """Write one line; returns the redacted line (without newline)."""
        line = f"{utc_now_iso()} {level} [{step}] {message}"
        if details is not None:
            line += " " + _details_json(details)
        # Child output can contain newlines-in-lines (\r); keep one physical line per event.
        line = self.redactor(line.replace("\n", "\\n"))
        with self._mutex:
            if not self._fh.closed:
                self._fh.write(line + "\n")
                self._fh.flush()
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

    def close(self) -> None:
        """Close the file (idempotent); later calls still echo but write nothing."""
        with self._mutex:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
