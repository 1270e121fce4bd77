"""The seam between an upload and the platform protocol that carries it.

A transport takes a validated :class:`~launcher.upload.plan.UploadPlan` to a finalized platform
run. :class:`~launcher.upload.import038.Import038` (osmosis-ai 0.3.8's per-file import
protocol) is the one transport today; the 0.3.10 archive protocol (``files.jsonl`` plus a
streamed ``run.zip``) belongs beside it once its contract is public (docs/upload.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from launcher.errors import CLIError
from launcher.upload.plan import UploadPlan
from launcher.upload.progress import UploadProgress

__all__ = ["PlatformError", "Published", "Transport", "printable"]


def printable(text: str) -> str:
    """``text`` from the platform as it may be shown on a terminal: every character that is
    not printable (C0 and C1 controls, escape sequences' introducers, bidi and other format
    characters, line breaks) written as its Python escape, ``\\x9b``."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


class PlatformError(CLIError):
    """The platform answered with an error (or not at all). ``status`` is the HTTP status (None
    when there was no answer); ``code``/``details`` are the platform's."""

    default_code = "PLATFORM"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.status = status


@dataclass(frozen=True)
class Published:
    """A finalized platform run."""

    session_id: str
    status: str
    expected_files: int
    uploaded_files: int
    eval_run_id: str
    eval_run_name: str
    platform_url: str
    sent_files: int
    sent_bytes: int


class Transport(Protocol):
    """Carries a plan to the platform."""

    async def publish(
        self, plan: UploadPlan, *, replace: bool, progress: UploadProgress
    ) -> Published:
        """Start or resume the import of ``plan``, upload what the server lacks, finalize.

        Raises :class:`PlatformError` for the platform's errors (``status == 409`` is a
        conflict with results already imported) and :class:`RuntimeError`/:class:`ValueError`
        when the platform's answers do not fit the plan."""
        ...
