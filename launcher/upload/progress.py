"""Progress of an upload: the file being sent, bytes, rate and ETA.

Rich mode on a terminal shows a live bar (rich's transfer columns); rich mode without one
prints ``Uploading <path>...`` and, at most every few seconds, a byte count line; plain and
JSON modes show nothing while uploading (their result says what was sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from launcher.ui import UI

__all__ = ["UploadProgress", "format_bytes"]

_LINE_EVERY_S = 5.0


def format_bytes(count: float) -> str:
    """``12.3 MiB``-style size."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


class UploadProgress:
    """Counts the bytes of one upload and shows them as ``ui``'s mode allows."""

    def __init__(self, ui: UI | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._ui = ui
        self._clock = clock
        self.total = 0
        self.sent = 0
        self.files = 0
        self._started = 0.0
        self._last_line = 0.0
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def begin(self, total_bytes: int) -> None:
        """The bytes this invocation expects to send (the files the server lacks)."""
        self.total, self.sent, self._started = total_bytes, 0, self._clock()
        self._last_line = self._started
        ui = self._ui
        if ui is not None and ui.rich and ui.tty and total_bytes:
            self._bar = Progress(
                TextColumn("upload"),
                BarColumn(),
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=ui.console,
            )
            self._bar.start()
            self._task = self._bar.add_task("upload", total=total_bytes)

    def file(self, path: str) -> None:
        """A file starts (``Uploading <path>...``, as the reference prints it)."""
        self.files += 1
        if self._ui is not None and self._bar is None:
            self._ui.note(f"Uploading {path}...")
        elif self._bar is not None:
            self._bar.console.print(f"Uploading {path}...", style="dim", markup=False)

    def advance(self, delta: int) -> None:
        """``delta`` bytes sent (negative: a failed attempt's bytes taken back)."""
        self.sent += delta
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=max(0, self.sent))
            return
        now = self._clock()
        if self._ui is not None and now - self._last_line >= _LINE_EVERY_S:
            self._last_line = now
            self._ui.note(self.line())

    def line(self) -> str:
        """``<sent> / <total> · <rate>/s · ETA <s>``."""
        elapsed = self._clock() - self._started
        rate = self.sent / elapsed if elapsed > 0 else 0.0
        text = f"{format_bytes(self.sent)} / {format_bytes(self.total)}"
        if rate > 0:
            text += f" · {format_bytes(rate)}/s"
            remaining = max(0, self.total - self.sent)
            if remaining:
                text += f" · ETA {remaining / rate:.0f}s"
        return text

    def close(self) -> None:
        """Stop the live bar (idempotent)."""
        if self._bar is not None:
            self._bar.stop()
        self._bar = None
        self._task = None
