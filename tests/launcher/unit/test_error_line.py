"""The one-line ``Error:`` of a message of several lines (launcher.ui): a trailing ``Logs:``
line does not read as the continuation of the sentence before it."""

from __future__ import annotations

import io

from launcher.ui import UI


def _error(message: str) -> str:
    err = io.StringIO()
    UI("plain", stderr=err).error(message, code="X")
    return err.getvalue()


def test_a_trailing_logs_line_is_a_sentence_of_its_own() -> None:
    said = _error("the token its nodes were started with\nLogs: ws/.osmosis/evals/r/logs.txt")
    assert (
        said == "Error: the token its nodes were started with. Logs: ws/.osmosis/evals/r/logs.txt\n"
    )
    said = _error("uv sync failed (exit code 1).\n\nLogs: logs.txt\n")
    assert said == "Error: uv sync failed (exit code 1). Logs: logs.txt\n"


def test_other_lines_are_joined_by_spaces_as_the_reference_prints_lists() -> None:
    said = _error("Eval import failed validation\n- files.index.jsonl: row 3 missing\n- second")
    assert (
        said == "Error: Eval import failed validation - files.index.jsonl: row 3 missing - second\n"
    )
