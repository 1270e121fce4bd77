"""``rollbridge eval export``: one row per rollout (the latest record of each work item) with
its chat messages rebuilt from the trajectory, in JSON Lines and in Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import main
from launcher.export import EXPORT_FIELDS, trajectory_messages
from rollout_server.sdk import RolloutSample
from rollout_server.trajectory import build_trajectory
from tests.launcher.test_runs import make_run

TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"q": "apple"}'},
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is an apple?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a fruit"},
    {"role": "assistant", "content": "A fruit."},
]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _trajectory(run: Path, rollout_id: str, label: str) -> None:
    sample = RolloutSample(CONVERSATION, label=label)
    doc = build_trajectory(rollout_id, sample, sdk_version="0.1.0")
    trial = run / "rollout_trials" / rollout_id
    trial.mkdir(parents=True)
    (trial / "trajectory.json").write_text(json.dumps(doc))


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    error = {"phase": "bridge", "type": "UpstreamError", "message": "HTTP 502", "status": 502}
    records = [
        {"row_index": 1, "status": "failed", "error_type": "agent_error", "error": error},
        {"row_index": 0, "status": "failed", "error_type": "agent_error"},
        # --retry-failed re-ran row 0: the export keeps this latest record only.
        {
            "row_index": 0,
            "status": "success",
            "reward": 1.0,
            "tokens": 40,
            "max_context_tokens": 30,
        },
    ]
    run = make_run(tmp_path / ".osmosis" / "evals", "demo", records=records, total=2)
    _trajectory(run, "r2", "fruit")
    return run


def test_jsonl_rows(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "eval", "export", "demo", "--format", "jsonl")
    assert (code, err) == (0, "")
    target = run / "export.jsonl"
    assert out.strip() == f"Exported 2 rollouts of demo to {target}"
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [list(r) for r in rows] == [list(EXPORT_FIELDS)] * 2
    first, second = rows
    assert first == {
        "run_name": "demo",
        "local_run_id": "a" * 32,
        "row_index": 0,
        "run_index": 0,
        "source_row_index": None,
        "rollout_id": "r2",
        "status": "success",
        "reward": 1.0,
        "error_type": None,
        "error": None,
        "tokens": 40,
        "max_context_tokens": 30,
        "calls": None,
        "cached_tokens": None,
        "cache_write_tokens": None,
        "reasoning_tokens": None,
        "retries": None,
        "metrics": None,
        "duration_ms": 1.0,
        "model": "openai/gpt-4o-mini",
        "dataset_sha256": "d" * 64,
        "label": "fruit",
        "messages": CONVERSATION,
        "call_records": [],
    }
    assert (second["row_index"], second["status"], second["error_type"]) == (
        1,
        "failed",
        "agent_error",
    )
    assert second["error"] == {
        "phase": "bridge",
        "type": "UpstreamError",
        "message": "HTTP 502",
        "status": 502,
    }
    assert second["messages"] == [] and second["label"] is None  # no trajectory: no messages


def test_stdout_and_a_chosen_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "eval", "export", str(run), "-o", "-")
    assert code == 0 and len(out.splitlines()) == 2
    assert json.loads(out.splitlines()[0])["messages"] == CONVERSATION
    code, out, _ = _run(capsys, "--json", "eval", "export", "demo", "-o", "train.jsonl")
    assert code == 0
    assert json.loads(out)["result"] == {
        "path": str(tmp_path / "train.jsonl"),
        "rows": 2,
        "format": "jsonl",
    }
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 2
    # The rows are stdout's whole content: an envelope cannot go with them.
    code, out, err = _run(capsys, "--json", "eval", "export", "demo", "-o", "-")
    assert code == 1 and json.loads(out)["status"] == "error"
    assert "-o - (stdout) cannot go with --json" in out + err


def test_parquet(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    code, _, err = _run(capsys, "eval", "export", "demo", "--format", "parquet", "-o", "t.parquet")
    assert (code, err) == (0, "")
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column_names == list(EXPORT_FIELDS)
    first = table.to_pylist()[0]
    assert first["reward"] == 1.0 and first["label"] == "fruit"
    # Parquet has a fixed schema: absent message fields are nulls there.
    assert [
        {k: v for k, v in m.items() if v is not None} for m in first["messages"]
    ] == CONVERSATION
    assert table.to_pylist()[1]["error"]["status"] == 502


def test_bad_input(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "eval", "export", "nosuch")
    assert code == 1 and err.startswith("Error: no run 'nosuch' under ")
    code, _, err = _run(capsys, "eval", "export", "demo", "--format", "parquet", "-o", "-")
    assert code == 1 and err == "Error: -o - (stdout) works with --format jsonl only\n"
    code, _, err = _run(capsys, "eval", "export", "demo", "--format", "csv")
    assert code == 2 and "Invalid value for '--format'" in err


@pytest.mark.parametrize(
    "arguments",
    [
        "not json",  # kept as the model wrote it
        "[1, 2]",  # JSON, but not the object ATIF's arguments are
        '"just a string"',
        '{"raw": "ls -la"}',  # an object whose one key is "raw": still that object
        '{"raw": "x", "other": 1}',
    ],
)
def test_tool_call_arguments_come_back_as_the_model_wrote_them(arguments: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    conversation = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    doc = build_trajectory("r", RolloutSample(conversation), sdk_version="0")
    (stored,) = doc["steps"][0]["tool_calls"]
    assert isinstance(stored["arguments"], dict)  # ATIF: an object, always
    (message,) = trajectory_messages(doc)
    written = message["tool_calls"][0]["function"]["arguments"]
    if arguments.startswith("{"):
        assert json.loads(written) == json.loads(arguments)
    else:
        assert written == arguments
    assert trajectory_messages(None) == []


CALL = {
    "kind": "rollout",
    "rollout_id": "r9",
    "index": 0,
    "api": "chat.completions",
    "model": "gpt-4o-mini",
    "response_id": "chatcmpl-9x",
    "stream": True,
    "started_at": "2026-12-02T00:00:00.000000Z",
    "ttfb_ms": 12.5,
    "duration_ms": 40.0,
    "status": 200,
    "retries": [{"status": 429, "kind": "RateLimitError", "request_id": "req_1"}],
    "prompt_tokens": 30,
    "completion_tokens": 10,
    "total_tokens": 40,
    "cached_tokens": 24,
    "reasoning_tokens": 6,
    "finish_reason": "stop",
    "logprobs": {"token": ["A", " fruit"], "logprob": [-0.1, -0.2], "top": [[["An", -2.5]], []]},
    "token_ids": [32, 14098],
}


@pytest.fixture
def run_with_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    record = {
        "row_index": 0,
        "status": "success",
        "reward": 1.0,
        "rollout_id": "r9",
        "tokens": 40,
        "calls": 1,
        "cached_tokens": 24,
        "reasoning_tokens": 6,
        "retries": 1,
        "metrics": {"turns": 2, "solved": True},
    }
    run = make_run(tmp_path / ".osmosis" / "evals", "calls", records=[record], total=1)
    _trajectory(run, "r9", "fruit")
    superseded = {**CALL, "rollout_id": "r-old"}  # an earlier attempt's call: not this row's
    preflight = {"kind": "preflight", "rollout_id": None, "status": 200}
    (run / "calls.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in (preflight, superseded, CALL))
    )
    return run


def test_calls_and_usage_per_row_in_jsonl_and_parquet(
    run_with_calls: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "eval", "export", "calls", "-o", "-")
    assert code == 0
    row = json.loads(out)
    assert (row["calls"], row["cached_tokens"], row["reasoning_tokens"], row["retries"]) == (
        1,
        24,
        6,
        1,
    )
    assert row["metrics"] == {"turns": 2, "solved": True}
    assert row["messages"] == CONVERSATION
    (call,) = row["call_records"]
    assert call["ttfb_ms"] == 12.5 and call["retries"] == [
        {"status": 429, "kind": "RateLimitError", "request_id": "req_1"}
    ]
    assert call["request_id"] is None  # answered: the response id names it
    assert call["logprobs"] == {
        "token": ["A", " fruit"],
        "logprob": [-0.1, -0.2],
        "top": [[{"token": "An", "logprob": -2.5}], []],
    }
    assert call["token_ids"] == [32, 14098] and call["response_id"] == "chatcmpl-9x"
    pq = pytest.importorskip("pyarrow.parquet")
    code, _, err = _run(capsys, "eval", "export", "calls", "--format", "parquet", "-o", "c.pq")
    assert (code, err) == (0, "")
    back = pq.read_table(tmp_path / "c.pq").to_pylist()[0]
    assert back["cached_tokens"] == 24 and back["reasoning_tokens"] == 6
    assert json.loads(back["metrics"]) == {"turns": 2, "solved": True}
    assert back["call_records"] == [call]
