"""What ``rollbridge eval run`` shows: plan table, stage lines, notes, warnings, the progress
display, failed rows, the results table and the final result (docs/spec/supervisor.md §10).

Three output modes. ``rich`` (default) prints everything to stdout; ``plain`` prints only the
result message and next steps on stdout; ``json`` prints exactly one JSON envelope on stdout
and nothing else there. Warnings and errors go to stderr in every mode (JSON lines in ``json``
mode). Every string passes through the run's redactor before it is rendered, and the
underlying streams redact again, so a secret can reach the terminal by no path.

Why one module of this size: every line the run prints goes through one object so that the
three modes and the redaction cannot drift apart; splitting the progress display from the
tables would give the two halves the same mode and redactor plumbing to keep in step.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Literal, Protocol, TextIO, cast

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from rollout_server.protocol import sdk_version

__all__ = [
    "CLI_VERSION",
    "UI",
    "OutputMode",
    "ProgressCounters",
    "RedactingStream",
]

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
    skipped: int
    tokens: int

    @property
    def pass_rate(self) -> float: ...


class _LiveText(ProgressColumn):
    """A column re-rendered on every refresh, so the in-flight count and ETA move between
    results too (a task field would only change when a result arrives)."""

    def __init__(self, text: Callable[[], str]) -> None:
        super().__init__()
        self._text = text

    def render(self, task: Task) -> Text:
        return Text(self._text())


class _Progress(Progress):
    """The progress bar, with a live line under it when ``below`` gives one (``--ray``'s
    replicas)."""

    def __init__(self, *columns: ProgressColumn, below: Callable[[], str], **kwargs: Any) -> None:
        self._below = below  # first: the parent may render while it starts
        super().__init__(*columns, **kwargs)

    def get_renderables(self) -> Iterable[Any]:
        yield from super().get_renderables()
        line = self._below()
        if line:
            yield Text(line, style="dim")


def one_line(message: str) -> str:
    """A multi-line message as one line, its lines joined by spaces (as the reference prints
    its lists: ``failed validation - <item> - <item>``); a sentence before a trailing ``Logs:
    <path>`` line is ended with a period first, so that the path does not read as its
    continuation."""
    line = ""
    for part in (part.strip() for part in message.splitlines()):
        if not part:
            continue
        if line and part.startswith("Logs:") and not line.endswith((".", ";", ":", "!", "?", ")")):
            line += "."
        line = f"{line} {part}" if line else part
    return line


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
        clock: Callable[[], float] = time.monotonic,
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
        self._clock = clock
        self._kept = 0  # work items whose record this invocation keeps (not pending)
        self._finished = 0  # results recorded by this invocation
        self._started = 0.0
        self._in_flight: Callable[[], int] | None = None
        self._lowered_limit: Callable[[], int | None] | None = None
        self._closing = False
        self._stopping: str | None = None  # see progress_stopping
        self._replicas: Callable[[], str] | None = None  # see show_replicas

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
            text = Text(f"⚠ {message}", style="yellow")
            live = self._progress
            if live is not None and live.live.is_started and self._err.isatty():
                # Both on the terminal: written to stderr it would land across the live view
                # (rich redraws over the lines it counts); the view prints it above itself.
                live.console.print(text)
            else:
                self.err_console.print(text)

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
        self._err.write(f"Error: {one_line(message)}\n")
        self._err.flush()

    # -- tables ----------------------------------------------------------------------------

    def plan_table(self, rows: Sequence[tuple[str, str]], title: str = "Local Evaluation") -> None:
        """The rounded two-column plan table (§10.1), titled where the run's rollouts run."""
        if not self.rich:
            return
        table = Table(
            title=self.redact(title), show_header=False, title_justify="left", box=box.ROUNDED
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

    def open_progress(
        self,
        total: int,
        counters: ProgressCounters,
        pending: int | None = None,
        in_flight: Callable[[], int] | None = None,
        lowered_limit: Callable[[], int | None] | None = None,
    ) -> None:
        """Open the progress display right before scheduling starts.

        ``pending`` work items are dispatched now (default: those without a record); the rest
        of ``total`` count as done from the start, so a resume or ``--retry-failed`` shows
        ``kept + finished here`` out of ``total``. ``in_flight`` reads the rollouts running;
        ``lowered_limit`` reads the in-flight limit while adaptive concurrency holds it below
        the configured one (``None`` otherwise), shown as ``3 in flight (limit 4)``.
        """
        self._counters = counters
        self._total = total
        pending = total - counters.completed if pending is None else pending
        self._kept = max(0, total - pending)
        self._finished = 0
        self._started = self._clock()
        self._in_flight = in_flight
        self._lowered_limit = lowered_limit
        self._closing = False
        if not self.rich:
            return
        if self.tty:
            self._progress = _Progress(
                SpinnerColumn(),
                TextColumn("rollouts"),
                BarColumn(),
                MofNCompleteColumn(),
                _LiveText(self._summary),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
                below=lambda: self.redact(self._replicas() if self._replicas else ""),
            )
            self._progress.start()
            self._task = self._progress.add_task("rollouts", total=total, completed=self._done)
        else:
            self._print(self._line(), style="dim")

    @property
    def _done(self) -> int:
        return min(self._total, self._kept + self._finished)

    def _summary(self) -> str:
        """``pass P% · failed F[ · skipped S] · <rate> · ETA <t> · <n> in flight · <k> tokens``:
        the rate and ETA once this invocation finished an item, in flight and ETA only while
        running, ``stopped`` when the display closes before every item is done."""
        counters = self._counters
        if counters is None:
            return ""
        parts = [f"pass {counters.pass_rate:.0%}", f"failed {counters.failed}"]
        if counters.skipped:
            parts.append(f"skipped {counters.skipped}")
        elapsed = self._clock() - self._started
        rate = self._finished / elapsed if self._finished and elapsed > 0 else None
        if rate is not None:
            parts.append(f"{rate:.1f}/s" if rate >= 1 else f"{rate * 60:.1f}/min")
        remaining = self._total - self._done
        # Never more than is left: a result is counted before its worker leaves in-flight.
        running = min(self._in_flight(), remaining) if self._in_flight is not None else None
        if not self._closing and self._stopping is None:
            if rate is not None and remaining > 0:
                parts.append(f"ETA {_clock_text(remaining / rate)}")
            if running:
                lowered = self._lowered_limit() if self._lowered_limit is not None else None
                limit = f" (limit {lowered})" if lowered is not None else ""
                parts.append(f"{running} in flight{limit}")
        if counters.tokens:
            parts.append(f"{counters.tokens:,} tokens")
        if self._closing and remaining > 0:
            parts.append("stopped")
        elif self._stopping is not None:
            parts.append(f"{self._stopping}: {running} left" if running else self._stopping)
        return " · ".join(parts)

    def _line(self) -> str:
        return f"{self._done}/{self._total} {self._summary()}"

    def progress_update(self, finished: str | None = None) -> None:
        """Count one result of this invocation (``finished`` names it, for example ``row 3 run
        0: success, reward 1``) and show the counts; when not a terminal, one line per finished
        item."""
        if self._counters is None:
            return
        if finished is not None:
            self._finished += 1
        if not self.rich:
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self._done)
        elif finished is not None:
            self._print(f"{self._line()} · {finished}", style="dim")
        else:
            self._print(self._line(), style="dim")

    def show_replicas(self, line: Callable[[], str] | None) -> None:
        """Show ``line()`` (the replicas of a ``--ray`` run) under the live progress bar;
        None stops."""
        self._replicas = line

    def replicas_changed(self) -> None:
        """The replica set changed: when not a terminal, one line saying how it is now (a
        terminal shows the live line of :meth:`show_replicas` anyway)."""
        if self.rich and not self.tty and self._counters is not None and self._replicas:
            self._print(self._replicas(), style="dim")

    def progress_stopping(self, label: str = "cancelling") -> None:
        """Winding down (Ctrl-C, a halt): ETA and in flight give way to ``<label>: N left``."""
        if self._counters is None or self._stopping is not None:
            return
        self._stopping = label
        self.progress_update()

    def close_progress(self) -> None:
        """Close the live display (idempotent). Its last frame keeps the true count: after
        Ctrl-C it shows ``k/N … stopped``, never a bar stretched to look complete."""
        if self._progress is not None:
            self._closing = True
            if self._task is not None:
                self._progress.update(self._task, completed=self._done)
            self._progress.stop()
        self._progress = None
        self._task = None
        self._counters = None
        self._in_flight = None
        self._closing = False
        self._stopping = None

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
                    "result": _redact_obj(dict(resource or {}), self.redact),
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
        """The one JSON document of ``--json`` for a successful command (``operation`` names it,
        e.g. ``eval.list``; ``result`` is its payload): the same envelope as ``eval run``'s."""
        self._emit_json(
            {"operation": operation, "status": "success", "message": message, "result": result}
        )

    def _emit_json(self, body: Mapping[str, Any]) -> None:
        envelope = {"schema_version": _SCHEMA_VERSION, "cli_version": CLI_VERSION, **body}
        self._out.write(json.dumps(envelope, ensure_ascii=False, allow_nan=False) + "\n")
        self._out.flush()


def _clock_text(seconds: float) -> str:
    """``0:42``, ``12:05``, ``1:02:03`` (an ETA, rounded up to the second)."""
    total = int(-(-seconds // 1))
    hours, rem = divmod(total, 3600)
    minutes, secs = divmod(rem, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _redact_obj(obj: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, Mapping):
        return {redact(str(k)): _redact_obj(v, redact) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_redact_obj(v, redact) for v in obj]
    return obj
