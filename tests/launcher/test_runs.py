"""``rollbridge eval list`` and ``rollbridge eval clean``, on run directories as the supervisor
leaves them (manifest, journal, progress, metrics, locks)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import main
from launcher.rundir.lock import RunLock


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def make_run(
    root: Path,
    name: str,
    *,
    records: list[dict[str, Any]] | None = None,
    total: int = 3,
    created: str = "2026-01-02T03:04:05.000000Z",
    model: str = "openai/gpt-4o-mini",
) -> Path:
    run = root / name
    (run / "rollout_trials").mkdir(parents=True)
    manifest = {
        "schema_version": 1,
        "local_run_id": "a" * 32,
        "run_name": name,
        "created_at": created,
        "inputs": {
            "model_path": model,
            "dataset": {"sha256": "d" * 64, "selected_source_rows": f"0-{total - 1}"},
            "n": 1,
        },
        "provenance": {},
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    lines = [
        json.dumps({"rollout_id": f"r{i}", "duration_ms": 1.0, "run_index": 0, **r})
        for i, r in enumerate(records or [])
    ]
    (run / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    (root / ".locks").mkdir(exist_ok=True)
    (root / ".locks" / f"{name}.lock").touch()
    return run


def ok(row: int, reward: float = 1.0) -> dict[str, Any]:
    return {"row_index": row, "status": "success", "reward": reward}


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path / ".osmosis" / "evals"


def test_list_json(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(ws, "done", records=[ok(0), ok(1, 0.0), ok(2)], created="2026-01-01T00:00:00Z")
    # A retried item counts once (the latest record); a skipped one is out of the pass rate.
    make_run(
        ws,
        "half",
        records=[
            {"row_index": 0, "status": "failed"},
            ok(0),
            {"row_index": 1, "status": "skipped"},
        ],
        created="2026-01-02T00:00:00Z",
    )
    make_run(ws, "nothing", created="2026-01-03T00:00:00Z")
    make_run(ws, "old.archive-20260101T000000Z", records=[ok(0)])
    code, out, err = _run(capsys, "eval", "list", "--json")
    assert (code, err) == (0, "")
    envelope = json.loads(out)
    assert envelope["operation"] == "eval.list" and envelope["status"] == "success"
    runs = {r["name"]: r for r in envelope["result"]["runs"]}
    assert list(runs) == ["done", "half", "nothing"]  # oldest first, archives left out
    assert runs["done"] == {
        "name": "done",
        "status": "complete",
        "done": 3,
        "total": 3,
        "pass_rate": pytest.approx(2 / 3),
        "model": "openai/gpt-4o-mini",
        "started": "2026-01-01T00:00:00Z",
        "path": ".osmosis/evals/done",
    }
    assert (runs["half"]["status"], runs["half"]["done"], runs["half"]["pass_rate"]) == (
        "incomplete",
        2,
        1.0,
    )
    assert (runs["nothing"]["status"], runs["nothing"]["pass_rate"]) == ("empty", None)


def test_list_shows_a_run_a_supervisor_holds_as_running(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(ws, "busy", records=[ok(0)])
    lock = RunLock.acquire(ws, "busy")
    try:
        code, out, _ = _run(capsys, "eval", "list", "--json")
    finally:
        lock.release()
    assert code == 0
    assert json.loads(out)["result"]["runs"][0]["status"] == "running"


def test_list_plain_is_one_line_per_run(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(ws, "done", records=[ok(0), ok(1), ok(2)])
    make_run(ws, "later", records=[ok(0)], created="2026-02-02T03:04:05Z")
    code, out, _ = _run(capsys, "eval", "list", "--plain")
    assert code == 0
    assert out.splitlines() == [
        "done\tcomplete\t3/3\t100.0%\topenai/gpt-4o-mini\t2026-01-02 03:04Z\t.osmosis/evals/done",
        "later\tincomplete\t1/3\t100.0%\topenai/gpt-4o-mini\t2026-02-02 03:04Z\t.osmosis/evals/later",
    ]


def test_list_piped_is_porcelain(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(ws, "nothing", model="hosted_vllm/a-rather-long-model-name-for-a-pipe")
    code, out, err = _run(capsys, "eval", "list")
    assert code == 0
    assert out.splitlines() == [
        "nothing\tempty\t0/3\t-\thosted_vllm/a-rather-long-model-name-for-a-pipe\t"
        "2026-01-02 03:04Z\t.osmosis/evals/nothing"
    ]
    assert err == "1 run with nothing recorded: `rollbridge eval clean` removes them.\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", [80, 60, 40, 200])
def test_list_fits_a_narrow_terminal_with_names_whole(
    ws: Path, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    from launcher.runs import list_command
    from launcher.ui import UI

    monkeypatch.setenv("COLUMNS", str(columns))
    long_name = "a-run-with-a-long-descriptive-name"
    make_run(ws, long_name, records=[ok(0)], model="openrouter/anthropic/claude-sonnet-4-6")
    make_run(ws, "nothing")
    out = _Terminal()
    ui = UI("rich", stdout=out, stderr=io.StringIO(), stdin=io.StringIO())
    assert list_command(ui, ws, ws.parent.parent) == 0
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()
    assert lines[0].split()[:3] == ["name", "status", "done"]
    assert lines[1].split()[0] == long_name and lines[2].split()[0] == "nothing"
    assert max(map(len, lines[:3])) <= max(columns, len(long_name) + 20)
    if columns >= 200:  # everything fits: nothing cut, nothing dropped
        assert "openrouter/anthropic/claude-sonnet-4-6" in lines[1]
        assert lines[1].rstrip().endswith(f".osmosis/evals/{long_name}")
    assert "1 run with nothing recorded" in lines[-1]


def test_fit_table_cuts_the_path_in_the_middle_then_drops_columns() -> None:
    from launcher.list_layout import fit_table, middle_cut

    assert middle_cut("abcdefghij", 5) == "ab…ij"
    assert middle_cut("abc", 5) == "abc"
    columns = ("name", "model", "path")
    rows = [("run-1", "openai/gpt-4o-mini", "/home/user/project/.osmosis/evals/run-1")]
    wide = fit_table(columns, rows, 200, drop_order=("model", "path"), middle=("path",))
    assert wide[1] == "run-1  openai/gpt-4o-mini  /home/user/project/.osmosis/evals/run-1"
    cut = fit_table(columns, rows, 50, drop_order=("model", "path"), middle=("path",))
    assert cut[1] == "run-1  openai/gpt-4o-mini  /home/user/…evals/run-1"
    dropped = fit_table(columns, rows, 30, drop_order=("model", "path"), middle=("path",))
    assert dropped == ["name   path", "run-1  /home/user/…evals/run-1"]
    only = fit_table(columns, rows, 3, drop_order=("model", "path"), middle=("path",))
    assert only == ["name", "run-1"]


def test_list_outside_a_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "eval", "list")
    assert code == 1 and out == ""
    assert err.startswith("Error: no workspace at or above") and len(err.splitlines()) == 1
    (tmp_path / "elsewhere").mkdir()
    code, out, _ = _run(capsys, "eval", "list", "-o", str(tmp_path / "elsewhere"), "--plain")
    assert (code, out) == (0, "")


def test_clean_removes_only_runs_with_nothing_recorded(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = make_run(ws, "done", records=[ok(0)])
    make_run(ws, "empty1")
    make_run(ws, "empty2")
    live = make_run(ws, "orphaned-server")
    (live / "server.json").write_text("{}")
    (ws / ".locks" / "gone.lock").touch()  # a lock left behind by a run that no longer exists
    code, out, err = _run(capsys, "eval", "clean", "--yes")
    assert code == 0
    assert "Removed 2 run(s) with nothing recorded and 1 stale lock(s)." in out
    assert "kept .osmosis/evals/orphaned-server" in err
    assert sorted(p.name for p in ws.iterdir()) == [".locks", "done", "orphaned-server"]
    assert sorted(p.name for p in (ws / ".locks").iterdir()) == [
        "done.lock",
        "orphaned-server.lock",
    ]
    assert (kept / "events.jsonl").read_text()


def test_clean_asks_first(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(ws, "empty1")
    code, _, err = _run(capsys, "eval", "clean")  # stdin is not a terminal: refuse, say why
    assert code == 1 and err == (
        "Error: 1 empty run(s) and 0 stale lock(s) would be removed; pass --yes to confirm\n"
    )
    assert (ws / "empty1").is_dir()
    from launcher.ui import UI

    monkeypatch.setattr(UI, "interactive", property(lambda self: True))
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, out, _ = _run(capsys, "eval", "clean")
    assert code == 0 and "Remove 1 run(s) with nothing recorded? [y/N]" in out
    assert "Nothing removed." in out and (ws / "empty1").is_dir()
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    code, out, _ = _run(capsys, "eval", "clean")
    assert code == 0 and not (ws / "empty1").exists()


def test_clean_leaves_a_held_run_alone(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(ws, "starting")
    lock = RunLock.acquire(ws, "starting")
    try:
        code, out, _ = _run(capsys, "eval", "clean", "--yes")
    finally:
        lock.release()
    assert code == 0 and "Nothing to clean" in out
    assert (ws / "starting").is_dir()


def test_clean_and_list_leave_directories_that_are_not_runs_alone(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o .`` at a workspace's root, or an output root holding the user's own folders:
    only run directories are listed, and nothing else is ever removed."""
    make_run(ws, "empty1")
    notes = ws / "important"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work")
    foreign = ws / "other-tool"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "not ours"}')
    # Named like an archive, but not one --fresh made: a run like any other.
    make_run(ws, "my.archive-old")
    make_run(ws, "x.archive-20260101T000000Z")
    code, out, _ = _run(capsys, "eval", "list", "--plain")
    listed = sorted(line.split("\t")[0] for line in out.splitlines())
    assert code == 0 and listed == ["empty1", "my.archive-old", "other-tool"]
    code, out, err = _run(capsys, "eval", "clean", "--yes")
    assert code == 0 and "Removed 2 run(s) with nothing recorded." in out
    assert "kept .osmosis/evals/other-tool: its manifest.json is not one rollbridge wrote" in err
    assert (notes / "thesis.txt").read_text() == "years of work"
    assert (foreign / "manifest.json").is_file()
    assert (ws / "x.archive-20260101T000000Z").is_dir()
    assert not (ws / "empty1").exists() and not (ws / "my.archive-old").exists()
    # At a workspace's root: its configs/ is not a run.
    root = ws.parent.parent
    code, out, _ = _run(capsys, "eval", "clean", "-o", str(root), "--yes")
    assert code == 0 and "Nothing to clean" in out
    assert (root / "configs" / "eval").is_dir()


@pytest.mark.parametrize("journal", ["missing", "zero bytes", "zero-filled"])
def test_clean_keeps_a_run_with_results_whatever_its_journal(
    ws: Path, capsys: pytest.CaptureFixture[str], journal: str
) -> None:
    """Results in index.jsonl, calls.jsonl or rollout_trials keep a run, whether its journal
    is missing, empty or unreadable: it lists as damaged, counting its index rows."""
    run = make_run(ws, "kept", records=[ok(0), ok(1)])
    rows = "".join(json.dumps({"row_index": i, "run_index": 0}) + "\n" for i in range(2))
    (run / "index.jsonl").write_text(rows)
    (run / "rollout_trials" / "r0").mkdir()
    size = (run / "events.jsonl").stat().st_size
    if journal == "missing":
        (run / "events.jsonl").unlink()
    else:
        (run / "events.jsonl").write_bytes(b"" if journal == "zero bytes" else b"\0" * size)
    code, out, _ = _run(capsys, "eval", "list", "--plain")
    assert code == 0 and out.split("\t")[:3] == ["kept", "damaged", "2/3"]
    code, out, _ = _run(capsys, "eval", "clean", "--yes")
    assert code == 0 and "Nothing to clean" in out
    assert (run / "index.jsonl").read_text() == rows


@pytest.mark.parametrize("only", ["calls.jsonl", "rollout_trials"])
def test_clean_keeps_a_run_whose_only_record_is_a_call_or_a_trial(
    ws: Path, capsys: pytest.CaptureFixture[str], only: str
) -> None:
    run = make_run(ws, "calls")
    if only == "calls.jsonl":
        (run / "calls.jsonl").write_text('{"rollout_id": "r0"}\n')
    else:
        (run / "rollout_trials" / "r0").mkdir()
    code, out, _ = _run(capsys, "eval", "clean", "--yes")
    assert code == 0 and "Nothing to clean" in out and run.is_dir()


@pytest.mark.parametrize("command", ["list", "clean"])
def test_an_output_root_that_is_missing_or_a_file_is_one_line(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for root, says in ((tmp_path / "nowhere", "does not exist"), (afile, "is not a directory")):
        flag = "--yes" if command == "clean" else "--plain"
        code, out, err = _run(capsys, "eval", command, "-o", str(root), flag)
        assert code == 1, (out, err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and str(root) in lines[0] and says in lines[0], err
