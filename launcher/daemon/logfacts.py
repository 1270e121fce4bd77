"""What a run child's ``logs.txt`` lines say (:class:`LogFacts`), read once and then only
where the file grew.

The facts are a fold over the lines from the child's first one: the last stage, whether it
dispatched, the tunnel URL, and the error or halt that ended the latest invocation. A run's log
only grows (its writer appends; ``--fresh`` moves the whole directory away), so the daemon
keeps, per file and first line, the fold up to the last whole line it read, with the file's
identity and the bytes just before that position (:class:`launcher.daemon.logscan.LineFold`):
the next view of the run folds only the lines added since, a view of an ended run reads nothing
but those few bytes. Each read holds one block of the file; a file replaced (another inode),
shorter than the position kept, or rewritten in place (other bytes before it) is folded again
from its start.

Within a block only the lines that can change the fold are parsed: those with an ``INFO`` or
``ERROR`` step that matters, found by one regular-expression search over the block, and the
block's last ``INFO`` line (the stage), found from its end. The result is the one a parse of
every line would give; lines are split at ``\\n`` only (a ``\\r`` before it is dropped), as the
log's writer writes them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.daemon.logscan import LineFold
from launcher.rundir.logs import RUN_FAILED, line_details

__all__ = ["LogFacts", "log_facts"]

_LOG_STEP = re.compile(r"^\S+ (?P<level>[A-Z]+) \[(?P<step>[^\]]+)\] (?P<message>.*)$")
_URL = re.compile(r"https://[^\s\"',)]+")
#: Steps that mean the run is past start-up and dispatching.
_DISPATCH_STEP = "schedule"
#: Every line that changes the fold other than by its stage holds one of these (a superset:
#: each candidate is parsed with ``_LOG_STEP`` before it counts).
_CANDIDATE = re.compile(rb" (?:INFO \[(?:run|schedule|tunnel)\]|ERROR \[(?:run|dispatch)\]) ")
_INFO = b" INFO ["
_HALTING = "halting dispatch "
#: Folds kept (one per run the daemon views; a few hundred bytes each, more for long messages).
_KEPT = 256


@dataclass
class LogFacts:
    """What this child's ``logs.txt`` lines say: the last stage, dispatch, the tunnel URL."""

    stage: str | None = None
    stage_message: str | None = None
    dispatching: bool = False
    tunnel_url: str | None = None
    error: str | None = None
    """The error that stopped the latest invocation, from its ``ERROR [run]`` line."""
    halted: str | None = None
    """Why the latest invocation halted dispatch (its ``ERROR [dispatch] halting dispatch``
    line: the same failure again and again, too few cluster replicas, no descriptors)."""


def _fold_block(facts: LogFacts, block: bytes) -> None:
    """Fold the lines of ``block`` into ``facts``, parsing only the lines that matter."""
    seen = -1
    for candidate in _CANDIDATE.finditer(block):
        start = block.rfind(b"\n", 0, candidate.start()) + 1
        if start == seen:
            continue  # a second marker on a line already folded
        seen = start
        _fold_line(facts, _line(block, start))
    at = block.rfind(_INFO)
    while at >= 0:
        start = block.rfind(b"\n", 0, at) + 1
        match = _LOG_STEP.match(_line(block, start))
        if match is not None and match["level"] == "INFO":
            facts.stage, facts.stage_message = match["step"], match["message"]
            return
        at = block.rfind(_INFO, 0, start)


def _line(block: bytes, start: int) -> str:
    stop = block.find(b"\n", start)
    raw = block[start:] if stop < 0 else block[start:stop]
    return raw.removesuffix(b"\r").decode("utf-8", "replace")


def _fold_line(facts: LogFacts, raw: str) -> None:
    """One line's effect on ``facts`` (what a parse of every line in order does)."""
    match = _LOG_STEP.match(raw)
    if match is None:
        return
    level, step, message = match["level"], match["step"], match["message"]
    if level == "ERROR" and step == "run":
        if message.startswith(RUN_FAILED):
            facts.error = message[len(RUN_FAILED) :]
    elif level == "ERROR" and step == "dispatch":
        facts.halted = _halt_reason(message) or facts.halted
    if level != "INFO":
        return
    if step == "run":
        facts.error = facts.halted = None  # a later invocation began
    facts.stage, facts.stage_message = step, message
    if step == _DISPATCH_STEP:
        facts.dispatching = True
    if step == "tunnel":
        url = _URL.search(message)
        facts.tunnel_url = url.group(0) if url else facts.tunnel_url


def _halt_reason(message: str) -> str | None:
    """The reason of a ``halting dispatch {"reason": …}`` line, or None."""
    details = line_details(message, _HALTING)
    reason = details.get("reason") if details is not None else None
    return reason if isinstance(reason, str) and reason else None


_folds = LineFold(LogFacts, _fold_block, dataclasses.replace, kept=_KEPT)


def log_facts(logs_path: Path, offset: int) -> LogFacts:
    """The facts of ``logs.txt``'s lines from ``offset`` (where this child's lines begin)."""
    return dataclasses.replace(_folds(logs_path, offset))
