"""Every input rule of the reference's ``eval rubric`` (spec Part D.1, D.2), through the real
CLI entry point: one ``Error:`` line, exit 1, and no judge call (there is no judge to call:
``OPENAI_BASE_URL`` points at a closed port, so a call would fail differently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rubric.conftest import conversation, invoke, write_jsonl


@pytest.fixture(autouse=True)
def _nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unused-0123456789")
    monkeypatch.chdir(tmp_path)


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    outcome = invoke(capsys, "eval", "rubric", *args)
    assert outcome.code == 1, outcome
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), outcome.err
    assert "Traceback" not in outcome.err
    return lines[0].removeprefix("Error: ")


def _good(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "good.jsonl", conversation("fine"))


def test_data_path_must_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    message = _error(capsys, "-d", str(missing), "-r", "x", "--model", "openai/j")
    assert message == f"Data path '{missing}' does not exist."


def test_data_path_must_not_be_a_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    message = _error(capsys, "-d", str(tmp_path), "-r", "x", "--model", "openai/j")
    assert message == f"Expected a file but received directory '{tmp_path}'."


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "Rubric file '{p}' does not exist."),
        ("directory", "Expected a file but received directory '{p}'."),
        ("empty", "Rubric file '{p}' is empty."),
    ],
)
def test_rubric_file_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setup: str, expected: str
) -> None:
    path = tmp_path / "rubric.txt"
    if setup == "directory":
        path.mkdir()
    elif setup == "empty":
        path.write_text("  \n\t\n", encoding="utf-8")
    message = _error(capsys, "-d", str(_good(tmp_path)), "-r", f"@{path}", "--model", "openai/j")
    assert message == expected.format(p=path)


def test_rubric_file_tilde_is_expanded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    message = _error(capsys, "-d", str(_good(tmp_path)), "-r", "@~/r.txt", "--model", "openai/j")
    assert message == f"Rubric file '{tmp_path / 'r.txt'}' does not exist."


def test_inline_rubric_must_not_be_blank(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    message = _error(capsys, "-d", str(_good(tmp_path)), "-r", "   ", "--model", "openai/j")
    assert message == "Rubric text must not be empty."


@pytest.mark.parametrize("number", ["0", "-3"])
def test_number_must_be_positive(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, number: str
) -> None:
    message = _error(
        capsys, "-d", str(_good(tmp_path)), "-r", "x", "--model", "openai/j", "-n", number
    )
    assert message == "--number must be at least 1."


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['{"messages": [', ""], "Invalid JSON on line 1 of '{p}': "),
        (["", '["a list"]'], "Expected JSON object on line 2 of '{p}'."),
        (
            [
                '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]}'
            ],
            "Line 1 of '{p}': 'messages' list must contain at least one assistant message "
            "with non-empty content.",
        ),
        (
            ['{"messages": [{"role": "assistant", "content": [{"type": "image_url"}]}]}'],
            "Line 1 of '{p}': 'messages' list must contain at least one assistant message "
            "with non-empty content.",
        ),
        (
            ['{"solution_str": "   "}'],
            "Line 1 of '{p}' must include 'messages' (list) or 'solution_str' (string).",
        ),
        (
            ['{"messages": [], "ground_truth": "x"}'],
            "Line 1 of '{p}' must include 'messages' (list) or 'solution_str' (string).",
        ),
        (["", "   ", ""], "No JSON records found in '{p}'."),
    ],
)
def test_data_line_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str], expected: str
) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    message = _error(capsys, "-d", str(path), "-r", "x", "--model", "openai/j")
    if expected.endswith(": "):
        assert message.startswith(expected.format(p=path)), message
        assert "Expecting" in message
    else:
        assert message == expected.format(p=path)


def test_model_or_judges_required(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _error(capsys, "-d", str(_good(tmp_path)), "-r", "x") == (
        "--model is required (or --judges m1,m2,...)"
    )
    assert _error(
        capsys, "-d", str(_good(tmp_path)), "-r", "x", "--model", "a/b", "--judges", "c/d,e/f"
    ) == ("--model and --judges are mutually exclusive")


def test_data_or_run_required(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _error(capsys, "-r", "x", "--model", "openai/j") == (
        "pass either -d/--data or --run, not both or neither"
    )


def test_unknown_run_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    message = _error(capsys, "--run", "nothing-here", "-r", "x", "--model", "openai/j")
    assert message.startswith("run 'nothing-here' not found: no .osmosis/evals/nothing-here in ")
