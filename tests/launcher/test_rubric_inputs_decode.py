"""Input files of ``eval rubric`` that are not UTF-8: one ``Error:`` line naming the file and
where the bad byte is, exit 1, before any judge call (``OPENAI_BASE_URL`` points at a closed
port, so a call would fail differently); a run's damaged ``dataset_rows.jsonl`` line only costs
that row its context. And a score range with nothing in it is a usage error of ``--run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.rubric.runsource import load_run


@pytest.fixture(autouse=True)
def _nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unused-0123456789")
    monkeypatch.chdir(tmp_path)


def _rubric(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["eval", "rubric", *args, "--model", "openai/j"])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _one_error_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0].removeprefix("Error: ")


GOOD = json.dumps({"solution_str": "fine"}) + "\n"


def test_data_file_with_invalid_utf8_names_the_line_and_offset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(GOOD.encode() + b"\xff\xfe{}\n")
    code, _, err = _rubric(capsys, "-d", str(data), "-r", "x")
    message = _one_error_line(code, err)
    offset = len(GOOD.encode())
    assert message == (
        f"'{data}' is not UTF-8 text: invalid byte 0xff on line 2 (byte offset {offset})."
    )


def test_data_file_with_invalid_utf8_is_a_validation_error_under_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"\xff\xfe" + GOOD.encode())
    code, out, _ = _rubric(capsys, "--json", "-d", str(data), "-r", "x")
    error = json.loads(out)["error"]
    assert code == 1 and error["code"] == "VALIDATION"
    assert "line 1 (byte offset 0)" in error["message"] and str(data) in error["message"]


def test_rubric_file_with_invalid_utf8_names_the_line_and_offset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(GOOD)
    rubric = tmp_path / "rubric.txt"
    rubric.write_bytes(b"Score it.\nok \xfe\n")
    code, _, err = _rubric(capsys, "-d", str(data), "-r", f"@{rubric}")
    message = _one_error_line(code, err)
    assert message == f"'{rubric}' is not UTF-8 text: invalid byte 0xfe on line 2 (byte offset 13)."


def test_a_json_string_holding_a_line_separator_is_one_record(tmp_path: Path) -> None:
    from launcher.rubric.inputs import load_records

    data = tmp_path / "d.jsonl"
    text = json.dumps({"solution_str": "a\u2028b"}, ensure_ascii=False)
    data.write_bytes(text.encode() + b"\r\n\n")
    [record] = load_records(str(data))
    assert record.candidate == "a\u2028b"


def _run_dir(run: Path) -> Path:
    events = []
    for row in (0, 1):
        rollout_id = f"{row:032x}"
        events.append(
            {"rollout_id": rollout_id, "row_index": row, "run_index": 0, "status": "success"}
        )
        trial = run / "rollout_trials" / rollout_id
        trial.mkdir(parents=True)
        trajectory = {
            "session_id": rollout_id,
            "steps": [{"step_id": 1, "source": "agent", "message": f"answer {row}"}],
        }
        (trial / "trajectory.json").write_text(json.dumps(trajectory))
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    good_row = json.dumps({"row_index": 1, "prompt": "p1", "label": "l1"})
    (run / "dataset_rows.jsonl").write_bytes(
        b'{"row_index": 0, "prompt": "\xff"}\n' + good_row.encode()
    )
    return run


def test_run_dataset_row_with_invalid_utf8_only_loses_its_context(tmp_path: Path) -> None:
    records = load_run(_run_dir(tmp_path / "run")).records
    assert [(r.candidate, r.original_input, r.ground_truth) for r in records] == [
        ("answer 0", None, None),
        ("answer 1", "p1", "l1"),
    ]


@pytest.mark.parametrize(("low", "high"), [("1", "0"), ("0.5", "0.5")])
def test_an_empty_score_range_with_run_is_a_usage_error_before_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, low: str, high: str
) -> None:
    run = _run_dir(tmp_path / "run")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    args = ("--run", str(run), "-r", "x", "--score-min", low, "--score-max", high)
    code, out, err = _rubric(capsys, *args)
    assert code == 2 and out == "" and "Judged now" not in err
    assert err.strip().splitlines()[-1] == (
        f"Error: --score-max ({float(high)}) must be greater than --score-min ({float(low)})"
    )
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    code, out, _ = _rubric(capsys, "--json", *args)
    assert code == 2 and json.loads(out)["error"]["code"] == "VALIDATION"
