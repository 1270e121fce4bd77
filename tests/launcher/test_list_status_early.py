"""``eval list`` of a run stopped after the model check but before its first result: the
preflight call alone is no result, so the run is ``incomplete`` (as ``eval report`` has it),
not ``damaged``; a rollout's call still makes a run without a journal ``damaged``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.cli import main

PREFLIGHT = {"kind": "preflight", "rollout_id": None, "status": 200, "total_tokens": 9}
ROLLOUT_CALL = {"kind": "rollout", "rollout_id": "r0", "status": 200, "total_tokens": 9}


def _list(capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "list", "--plain"])
    out, _ = capsys.readouterr()
    assert exc.value.code in (0, None)
    return out.split("\t")


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / ".osmosis" / "evals"
    run = root / "early"
    (run / "rollout_trials").mkdir(parents=True)
    manifest = {
        "schema_version": 1,
        "local_run_id": "a" * 32,
        "run_name": "early",
        "created_at": "2026-01-02T03:04:05.000000Z",
        "inputs": {
            "model_path": "rollbridge/echo",
            "dataset": {"sha256": "d" * 64, "selected_source_rows": "0-20"},
            "n": 1,
        },
        "provenance": {},
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "events.jsonl").write_bytes(b"")
    (run / "index.jsonl").write_bytes(b"")
    (root / ".locks").mkdir()
    (root / ".locks" / "early.lock").touch()
    return run


def test_a_run_with_only_the_preflight_call_is_incomplete(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run / "calls.jsonl").write_text(json.dumps(PREFLIGHT) + "\n")
    assert _list(capsys)[:4] == ["early", "incomplete", "0/21", "-"]


def test_a_rollout_call_without_a_journal_is_still_damaged(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.dumps(PREFLIGHT), json.dumps(ROLLOUT_CALL)]
    (run / "calls.jsonl").write_text("".join(line + "\n" for line in lines))
    assert _list(capsys)[:2] == ["early", "damaged"]


def test_clean_keeps_a_run_with_only_the_preflight_call(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run / "calls.jsonl").write_text(json.dumps(PREFLIGHT) + "\n")
    with pytest.raises(SystemExit):
        main(["eval", "clean", "--yes"])
    out, _ = capsys.readouterr()
    assert "Nothing to clean" in out and (run / "calls.jsonl").is_file()
