"""What a trial's compose shim reported, and what a failed row's reason says of it.

The shim (``_compose_shim.py``) sees every ``exec`` of a trial and writes two small files into
the trial's reports dir (``staging/<rollout_id>/reports``, named by :data:`REPORTS_ENV` in the
Harbor process's environment):

* ``container-exit.json`` when an ``exec`` found the task's container not running. Harbor
  would poll it for 90 s and then fail with "Container did not become ready for exec"; the
  backend stops the trial as soon as this file appears (:func:`container_gone`) and the row's
  reason says what happened: the container, its exit code and the end of its log
  (:func:`container_exit_outcome`).
* ``verifier-exit.json``: the exit code of the task's tests, which Harbor does not keep.

:func:`with_verifier_detail` adds that exit code and the end of the tests' output
(``verifier/test-stdout.txt``, stdout and stderr together, bounded and scrubbed of every
secret) to a failed row's reason, and the exit code to every row's diagnostics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backend import FAILURE_KEY, ExecutionOutcome, ExecutionResult
from ..protocol import RolloutErrorCategory, RolloutStatus
from .archive import scrub_bytes, secret_spellings

__all__ = [
    "CONTAINER_EXIT",
    "REPORTS_ENV",
    "VERIFIER_EXIT",
    "ContainerExit",
    "container_exit",
    "container_exit_outcome",
    "container_gone",
    "output_tail",
    "verifier_exit_code",
    "with_verifier_detail",
]

#: The reports dir, in the Harbor process's environment (the shim writes there).
REPORTS_ENV = "ROLLBRIDGE_HARBOR_REPORTS"
CONTAINER_EXIT = "container-exit.json"
VERIFIER_EXIT = "verifier-exit.json"
#: A reason stays readable: the last lines of an output, and no more than this many bytes.
TAIL_LINES = 20
TAIL_BYTES = 2048
#: The diagnostics field with the tests' exit code.
VERIFIER_EXIT_FIELD = "harbor_verifier_exit_code"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def container_gone(reports: Path) -> bool:
    """Whether the shim has reported the task's container not running (cheap: one stat)."""
    return (reports / CONTAINER_EXIT).is_file()


def _scrubbed(text: str, secrets: Sequence[str]) -> str:
    clean = scrub_bytes(text.encode("utf-8", "replace"), secret_spellings(secrets))
    return clean.decode("utf-8", "replace") if clean is not None else "(withheld)"


def _tail(text: str, lines: int = TAIL_LINES, limit: int = TAIL_BYTES) -> str:
    """The last ``lines`` non-blank lines of ``text`` joined by `` | `` (one line), at most
    ``limit`` characters (cut at the front: the end is what failed)."""
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= limit else "…" + joined[-(limit - 1) :]


@dataclass(frozen=True)
class ContainerExit:
    """The task's container, found not running by an ``exec``."""

    container: str
    status: str
    exit_code: int | None
    #: The end of its log, scrubbed, on one line ("" when it logged nothing).
    log: str

    def reason(self) -> str:
        """The row's reason: what happened first, then the container and its log's end."""
        if self.status in ("created", "configured"):
            what = "the task's container never started (podman could not run its entrypoint)"
        elif self.exit_code is not None:
            what = f"the task's container exited with code {self.exit_code}"
        else:
            what = f"the task's container is {self.status}"
        said = f"; its log ends: {self.log}" if self.log else "; it logged nothing"
        return f"{what} ({self.container}){said}"


def container_exit(reports: Path, secrets: Sequence[str]) -> ContainerExit | None:
    """The shim's report of a container that was not running, or None when there is none."""
    document = _read(reports / CONTAINER_EXIT)
    if document is None:
        return None
    code = document.get("exit_code")
    return ContainerExit(
        container=str(document.get("container") or "?"),
        status=str(document.get("status") or "exited"),
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        log=_tail(_scrubbed(str(document.get("log") or ""), secrets)),
    )


def container_exit_outcome(gone: ContainerExit, extra: dict[str, Any]) -> ExecutionOutcome:
    """A row whose task container stopped under it: the sandbox is the task's side of the
    trial and it failed before (or without) the agent's fault, as a failed image build does."""
    return ExecutionOutcome(
        ExecutionResult(
            RolloutStatus.FAILURE,
            err_message=gone.reason(),
            err_category=RolloutErrorCategory.INTERNAL_ERROR,
            extra_fields={
                **extra,
                FAILURE_KEY: {
                    "phase": "server",
                    "type": "ContainerExited",
                    "container": gone.container,
                    "exit_code": gone.exit_code,
                },
            },
        )
    )


def verifier_exit_code(reports: Path) -> int | None:
    """The tests' exit code the shim saw, or None (no shim, or the tests never ran)."""
    document = _read(reports / VERIFIER_EXIT)
    code = document.get("exit_code") if document is not None else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def output_tail(path: Path, secrets: Sequence[str]) -> str | None:
    """The end of the output file ``path`` (bounded, scrubbed, one line), or None when absent."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            # Enough for TAIL_LINES ordinary lines; the tail is cut to TAIL_BYTES anyway.
            handle.seek(max(0, size - 8 * TAIL_BYTES))
            data = handle.read()
    except OSError:
        return None
    return _tail(_scrubbed(data.decode("utf-8", "replace"), secrets))


def _exit_words(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def with_verifier_detail(
    outcome: ExecutionOutcome, trial_dir: Path, reports: Path, secrets: Sequence[str]
) -> ExecutionOutcome:
    """``outcome`` with the tests' exit code in every phase's diagnostics and, when the tests
    ran (their output file exists, or the shim saw them end), their exit code and the end of
    their output appended to the reason of a failed grading, or of a failed workflow whose
    tests failed too (an agent's timeout whose tests passed says nothing more)."""
    code = verifier_exit_code(reports)
    tail = output_tail(trial_dir / "verifier" / "test-stdout.txt", secrets)
    if code is None and tail is None:
        return outcome
    words = [f"the task's tests {_exit_words(code)}" if code is not None else "the task's tests"]
    words.append(f"their output ends: {tail}" if tail else "they printed nothing")
    detail = "; ".join(words)
    for phase, grading in ((outcome.workflow, False), (outcome.grader, True)):
        if phase is None:
            continue
        if code is not None:
            phase.extra_fields = {**(phase.extra_fields or {}), VERIFIER_EXIT_FIELD: code}
        tests_failed = grading or (code is not None and code != 0)
        if phase.status == RolloutStatus.FAILURE and tests_failed:
            phase.err_message = f"{phase.err_message or 'failed'} ({detail})"
    return outcome
