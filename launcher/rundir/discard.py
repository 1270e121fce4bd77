"""A run that failed before it recorded anything leaves nothing to resume behind.

When ``rollbridge eval run`` fails or is declined before its first record (``uv sync``, a
missing secret, the model check, no ``--yes``, a rollout that does not start), the directory
it created would only be clutter under a generated name. :func:`settle_failed_run` removes
such a directory and its lock file, under the run's lock, and only when this invocation
created the directory and it holds no record (:class:`DiscardIfEmpty` wraps the named run). Its ``logs.txt``, when the error points at it,
moves to ``<output_root>/.failed-starts/<name>.log`` and the error says so. A directory that
stays (an existing run, a ``--name`` run whose start failed) is named at the end of the error,
unless the error is a :class:`CompleteRunError` (a complete run has nothing to resume).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from launcher.errors import CLIError, Declined, InteractiveRequiredError, exception_leaves
from launcher.rundir.atomic import ensure_dir
from launcher.rundir.lock import RunLock

__all__ = [
    "FAILED_STARTS",
    "CompleteRunError",
    "DiscardIfEmpty",
    "holds_no_record",
    "settle_failed_run",
]

#: Where the log of a removed run directory is kept (hidden: no command reads it as a run).
FAILED_STARTS = ".failed-starts"


class CompleteRunError(CLIError):
    """A failure after every result was recorded (the ``--upload`` step): the error says what
    to do, and no "resume with --name" advice is added, there being nothing to resume."""

    default_code = "LOCAL_EVAL"


def holds_no_record(run_dir: Path) -> bool:
    """True when ``run_dir`` has no journal bytes and no rollout artifacts (nothing to resume)."""
    try:
        if (run_dir / "events.jsonl").stat().st_size > 0:
            return False
    except FileNotFoundError:
        pass
    trials = run_dir / "rollout_trials"
    return not trials.is_dir() or not any(trials.iterdir())


def _rewrite(leaf: CLIError, message: str) -> None:
    leaf.message = message
    leaf.args = (message,)


def settle_failed_run(
    exc: BaseException,
    *,
    output_root: Path,
    name: str,
    lock: RunLock,
    created: bool,
    generated: bool,
    display: Callable[[Path], str],
) -> None:
    """Remove the run directory ``exc`` ended before any record, or name it in the error.

    Call with the run's lock held (``lock`` is removed with the directory). ``created``: the
    directory did not exist when this invocation took the lock. ``generated``: the name was
    generated, so nobody could resume it by name; a ``--name`` run is removed only when it
    never started anything (declined, or no ``--yes``), its log being worth keeping otherwise.
    """
    run_dir = Path(output_root) / name
    if not run_dir.is_dir() or run_dir.is_symlink():
        return
    leaves = exception_leaves(exc)
    nothing_started = any(isinstance(leaf, Declined | InteractiveRequiredError) for leaf in leaves)
    errors = [leaf for leaf in leaves if isinstance(leaf, CLIError)]
    if created and (generated or nothing_started) and holds_no_record(run_dir):
        logs = run_dir / "logs.txt"
        kept = Path(output_root) / FAILED_STARTS / f"{name}.log"
        with contextlib.suppress(OSError):
            if logs.is_file() and any(display(logs) in leaf.message for leaf in errors):
                ensure_dir(kept.parent)
                os.replace(logs, kept)
                # Its last lines name the file by its old place, which is gone.
                with kept.open("a", encoding="utf-8") as log:
                    log.write(
                        f"(this log was {display(logs)}; moved to {display(kept)} when the run's "
                        "directory, which held no record, was removed)\n"
                    )
                for leaf in errors:
                    _rewrite(leaf, leaf.message.replace(display(logs), display(kept)))
        try:
            shutil.rmtree(run_dir)
        except OSError:
            pass  # a directory that cannot be removed is named below, like any kept one
        else:
            lock.remove()
            return
    for leaf in errors:
        if not isinstance(leaf, CompleteRunError):
            _rewrite(leaf, f"{leaf.message} (run '{name}' kept: resume with --name {name})")


class DiscardIfEmpty:
    """``with lock, DiscardIfEmpty(run_dir, lock, generated, display): ...`` runs one named
    run and, when it raises, settles its directory (:func:`settle_failed_run`) before the lock
    is released. Whether the directory is new is decided on entry, under the lock."""

    def __init__(
        self, run_dir: Path, lock: RunLock, generated: bool, display: Callable[[Path], str]
    ) -> None:
        self.run_dir = Path(run_dir)
        self.lock = lock
        self.generated = generated
        self.display = display
        self.created = False

    def __enter__(self) -> DiscardIfEmpty:
        self.created = not os.path.lexists(self.run_dir)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            settle_failed_run(
                exc,
                output_root=self.run_dir.parent,
                name=self.run_dir.name,
                lock=self.lock,
                created=self.created,
                generated=self.generated,
                display=self.display,
            )
