"""What ``rollbridge eval run`` shows: plan table, stage lines, notes, warnings, the progress
display, failed rows, the results table and the final result (docs/spec/supervisor.md §10).

Three output modes. ``rich`` (default) prints everything to stdout; ``plain`` prints only the
result message and next steps on stdout; ``json`` prints exactly one JSON envelope on stdout
and nothing else there. Warnings and errors go to stderr in every mode (JSON lines in ``json``
mode). Every string passes through the run's redactor before it is rendered, and the
underlying streams redact again, so a secret can reach the terminal by no path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Literal, Protocol, TextIO, cast

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from rollout_server.protocol import sdk_version

__all__ = ["CLI_VERSION", "UI", "OutputMode", "ProgressCounters", "RedactingStream"]

OutputMode = Literal["rich", "plain", "json"]


CLI_VERSION = sdk_version()
_SCHEMA_VERSION = 1


class RedactingStream:
    """A text stream wrapper that redacts everything written through it."""

    def __init__(self, stream: TextIO, redact: Callable[[str], str]) -> None:
        self._stream = stream
        self._redact = redact

    def write(self, text: str) -> int:
        self._stream.write(self._redact(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8") or "utf-8"


class ProgressCounters(Protocol):
    """What the progress display reads (``launcher.rundir.metrics.LiveCounters`` fits)."""

    completed: int
    failed: int

    @property
    def pass_rate(self) -> float: ...


class UI:
    """Terminal output of one CLI invocation."""

    def __init__(
        self,
        mode: OutputMode = "rich",
        *,
        verbose: bool = False,
        redact: Callable[[str], str] = lambda s: s,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        stdin: TextIO | None = None,
    ) -> None:
        self.mode: OutputMode = mode
        self.verbose = verbose
        self._redact_fn = redact
        raw_out = stdout if stdout is not None else sys.stdout
        raw_err = stderr if stderr is not None else sys.stderr
        self._stdin = stdin if stdin is not None else sys.stdin
        self._out = RedactingStream(raw_out, self.redact)
        self._err = RedactingStream(raw_err, self.redact)
        # rich only writes, flushes and asks isatty/fileno/encoding: the wrapper has all of it.
        self.console = Console(file=cast(IO[str], self._out), highlight=False, soft_wrap=True)
        self.err_console = Console(file=cast(IO[str], self._err), highlight=False, soft_wrap=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._counters: ProgressCounters | None = None
        self._total = 0

    # -- redaction -------------------------------------------------------------------------

    def set_redactor(self, redact: Callable[[str], str]) -> None:
        """Use the run's redactor from now on (it learns secrets as the run resolves them)."""
        self._redact_fn = redact

    def redact(self, text: str) -> str:
        """``text`` with every known secret replaced."""
        return self._redact_fn(text)

    # -- mode helpers ----------------------------------------------------------------------

    @property
    def rich(self) -> bool:
        """True in the default rich mode (tables, stages, progress are shown)."""
        return self.mode == "rich"

    @property
    def interactive(self) -> bool:
        """Rich mode with a terminal on stdin: prompts are allowed."""
        return self.rich and self._stdin.isatty()

    @property
    def tty(self) -> bool:
        """Whether stdout is a terminal (live progress bar vs one line per item)."""
        return self._out.isatty()

    def _print(self, renderable: Any, *, style: str | None = None) -> None:
        if isinstance(renderable, str):
            renderable = Text(self.redact(renderable), style=style or "")
        self.console.print(renderable)

    # -- lines -----------------------------------------------------------------------------

    def stage(self, message: str) -> None:
        """A milestone line ``→ <message>`` (rich, not verbose: the log echo shows it then)."""
        if self.rich and not self.verbose:
            self._print(f"→ {message}", style="cyan")

    def note(self, message: str) -> None:
        """A dim note (rich only)."""
        if self.rich:
            self._print(message, style="dim")

    def log_line(self, line: str) -> None:
        """Echo one (already redacted) logs.txt line with ``--verbose``."""
        if self.rich and self.verbose:
            self._print(line, style="dim")

    def warning(self, message: str, code: str = "WARNING") -> None:
        """A warning on stderr in every mode."""
        message = self.redact(message)
        if self.mode == "json":
            self._err.write(
                json.dumps(
                    {
                        "schema_version": _SCHEMA_VERSION,
                        "cli_version": CLI_VERSION,
                        "warning": {"code": code, "message": message},
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
            self._err.flush()
        elif self.mode == "plain":
            self._err.write(f"warning: {message}\n")
            self._err.flush()
        else:
            self.err_console.print(Text(f"⚠ {message}", style="yellow"))

    def error(self, message: str, *, code: str = "ERROR", details: Any = None) -> None:
        """The one-line ``Error: ...`` (stderr), or the JSON error envelope (stdout)."""
        self.close_progress()
        message = self.redact(message)
        if self.mode == "json":
            error: dict[str, Any] = {"code": code, "message": message}
            if details is not None:
                error["details"] = _redact_obj(details, self.redact)
            self._emit_json({"status": "error", "error": error})
            return
        # One line: multi-line messages (for example a trailing "Logs: <path>") are joined.
        one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
        self._err.write(f"Error: {one_line}\n")
        self._err.flush()

    # -- tables ----------------------------------------------------------------------------

    def plan_table(self, rows: Sequence[tuple[str, str]]) -> None:
        """The rounded two-column "Local Evaluation" table (§10.1)."""
        if not self.rich:
            return
        table = Table(
            title="Local Evaluation", show_header=False, title_justify="left", box=box.ROUNDED
        )
        table.add_column(style="bold")
        table.add_column()
        for key, value in rows:
            table.add_row(self.redact(key), self.redact(value))
        self.console.print(table)

    def confirm(self, prompt: str, *, default: bool) -> bool:
        """Ask a yes/no question on the terminal; the caller checks :attr:`interactive`."""
        suffix = " [Y/n] " if default else " [y/N] "
        self.console.print(Text(self.redact(prompt) + suffix), end="")
        try:
            answer = self._stdin.readline()
        except (EOFError, OSError):
            return False
        answer = answer.strip().lower()
        if not answer:
            return default
        return answer in ("y", "yes")

    def failed_rows(self, lines: Iterable[str], *, title: str = "Failed rows") -> None:
        """The "Failed rows" section (§10.4), or another list of rows under ``title`` (the
        skipped rows, which are not failures); a reason line (indented) is shown dim red."""
        lines = list(lines)
        if not self.rich or not lines:
            return
        self.console.rule(Text(title))
        for line in lines:
            self._print(line, style="red" if line.startswith("  ") else None)

    def results_table(self, title: str, rows: Sequence[tuple[str, str]]) -> None:
        """The "Results" table (§10.5)."""
        if not self.rich:
            return
        table = Table(title=title, show_header=False, title_justify="left", box=box.ROUNDED)
        table.add_column(style="bold")
        table.add_column()
        for key, value in rows:
            table.add_row(self.redact(key), self.redact(value))
        self.console.print(table)

    # -- progress --------------------------------------------------------------------------

    def open_progress(self, total: int, counters: ProgressCounters) -> None:
        """Open the progress display right before scheduling starts."""
        self._counters = counters
        self._total = total
        if not self.rich:
            return
        if self.tty:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("rollouts"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[summary]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "rollouts", total=total, completed=counters.completed, summary=self._summary()
            )
        else:
            self._print(self._line(), style="dim")

    def _summary(self) -> str:
        assert self._counters is not None
        return f"pass {self._counters.pass_rate:.0%} · failed {self._counters.failed}"

    def _line(self) -> str:
        assert self._counters is not None
        return f"{self._counters.completed}/{self._total} {self._summary()}"

    def progress_update(self, finished: str | None = None) -> None:
        """Show the current counts; when not a terminal, one line per finished item, naming the
        item (``finished``, for example ``row 3 run 0: success, reward 1``)."""
        if self._counters is None or not self.rich:
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task, completed=self._counters.completed, summary=self._summary()
            )
        elif finished is not None:
            self._print(f"{self._line()} · {finished}", style="dim")
        else:
            self._print(self._line(), style="dim")

    def close_progress(self) -> None:
        """Close the live display (idempotent); unfinished bars are marked finished."""
        if self._progress is not None:
            if self._task is not None:
                task = self._progress.tasks[0]
                if not task.finished:
                    self._progress.update(self._task, total=task.completed or 1)
            self._progress.stop()
        self._progress = None
        self._task = None
        self._counters = None

    # -- the result ------------------------------------------------------------------------

    def result(
        self,
        *,
        status: Literal["success", "partial"],
        message: str,
        next_steps: Sequence[str],
        resource: Mapping[str, Any] | None = None,
    ) -> None:
        """Print the final message and next steps, or the JSON result envelope."""
        self.close_progress()
        if self.mode == "json":
            self._emit_json(
                {
                    "operation": "eval.run",
                    "status": status,
                    "message": self.redact(message),
                    "resource": _redact_obj(dict(resource or {}), self.redact),
                }
            )
            return
        if self.mode == "plain":
            self._out.write(message + "\n")
            for step in next_steps:
                self._out.write(step + "\n")
            self._out.flush()
            return
        self._print(message, style="green" if status == "success" else "yellow")
        for step in next_steps:
            self._print(f"  {step}")

    def envelope(self, operation: str, message: str, result: Mapping[str, Any]) -> None:
        """The one JSON document of ``--json`` for a successful command other than ``eval run``
        (``operation`` names it, e.g. ``eval.list``; ``result`` is its payload)."""
        self._emit_json(
            {"operation": operation, "status": "success", "message": message, "result": result}
        )

    def _emit_json(self, body: Mapping[str, Any]) -> None:
        envelope = {"schema_version": _SCHEMA_VERSION, "cli_version": CLI_VERSION, **body}
        self._out.write(json.dumps(envelope, ensure_ascii=False, allow_nan=False) + "\n")
        self._out.flush()


def _redact_obj(obj: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, Mapping):
        return {redact(str(k)): _redact_obj(v, redact) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_redact_obj(v, redact) for v in obj]
    return obj
