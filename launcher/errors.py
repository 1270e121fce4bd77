"""Typed errors a user can cause, each printed by the CLI as one ``Error: <message>`` line.

The CLI catches :class:`CLIError` (and its subclasses), passes ``message`` and ``details``
through the run's redactor, prints ``Error: <message>`` (or a JSON error envelope) and exits 1.
Messages never contain secret values: code that handles secrets names them, never echoes them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_INTERRUPTED",
    "CLIError",
    "ConflictError",
    "Declined",
    "DependencyError",
    "InteractiveRequiredError",
    "JournalCorruptError",
    "LocalEvalError",
    "NotFoundError",
    "ValidationError",
    "exception_leaves",
    "unwrap_group",
]

#: Exit code of an interrupted invocation (128 + SIGINT); here so that the CLI can name it
#: without importing trio.
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """An error whose message is meant for the user, printed as ``Error: <message>``.

    ``code`` is a short machine-readable category used by the ``--json`` error envelope:
    ``VALIDATION`` (bad config, flags or dataset), ``NOT_FOUND``, ``CONFLICT`` (lock held,
    changed inputs), ``LOCAL_EVAL`` (a run-time failure of the local evaluation),
    ``DEPENDENCY`` (``uv sync`` or a missing optional module), ``INTERACTIVE_REQUIRED``.
    ``details`` is optional structured context for the JSON envelope (redacted by the CLI too).
    """

    default_code = "VALIDATION"

    def __init__(
        self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details = details

    def __str__(self) -> str:
        return self.message


class ValidationError(CLIError):
    """Invalid user input: config, flags, dataset rows (code ``VALIDATION``)."""

    default_code = "VALIDATION"


class NotFoundError(CLIError):
    """A named file or directory does not exist (code ``NOT_FOUND``)."""

    default_code = "NOT_FOUND"


class ConflictError(CLIError):
    """The run directory is busy or was created with other inputs (code ``CONFLICT``)."""

    default_code = "CONFLICT"


class JournalCorruptError(CLIError):
    """A committed ``events.jsonl`` line is unreadable; the run refuses to resume over it."""

    default_code = "CONFLICT"


class LocalEvalError(CLIError):
    """A run-time failure of the local evaluation (server start, health, I/O)."""

    default_code = "LOCAL_EVAL"


class DependencyError(CLIError):
    """A dependency could not be provided (``uv sync`` failed, optional module missing)."""

    default_code = "DEPENDENCY"


class InteractiveRequiredError(CLIError):
    """The run needs an answer or a value that only an interactive session could give."""

    default_code = "INTERACTIVE_REQUIRED"


class Declined(Exception):
    """The user answered No at the confirmation (or Ctrl-C answered it): nothing ran."""

    def __init__(self, *, interrupted: bool) -> None:
        super().__init__("declined")
        self.interrupted = interrupted


def exception_leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (``[exc]`` itself when it is not a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in exception_leaves(inner)]
    return [exc]


def unwrap_group(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a user should see from a group raised by nested nurseries: a
    declined confirmation, then a :class:`CLIError` (its message says what to do), then an
    interrupt, then the first."""
    leaves = exception_leaves(group)
    for kinds in ((Declined,), (CLIError,), (KeyboardInterrupt,)):
        for leaf in leaves:
            if isinstance(leaf, kinds):
                return leaf
    return leaves[0]
