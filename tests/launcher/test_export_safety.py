"""``rollbridge eval export`` never writes among runs' own files, and names a run it cannot find
as ``eval report`` does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.launcher.test_runs import _run, make_run, ok


@pytest.fixture
def evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / ".osmosis" / "evals"
    make_run(root, "demo", records=[ok(0)], total=1)
    make_run(root, "other", records=[ok(0), ok(1)], total=2)
    return root


@pytest.mark.parametrize(
    "output",
    [
        ".osmosis/evals/other/events.jsonl",
        ".osmosis/evals/demo/events.jsonl",
        ".osmosis/evals/demo/manifest.json",
        ".osmosis/evals/other/rollout_trials/r0/x.jsonl",
        ".osmosis/evals/.locks/other.lock",
        ".osmosis/evals/newdir/x.jsonl",
    ],
)
def test_export_refuses_a_file_among_the_runs(
    evals: Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    journal = (evals / "other" / "events.jsonl").read_bytes()
    own = (evals / "demo" / "events.jsonl").read_bytes()
    code, out, err = _run(capsys, "eval", "export", "demo", "-o", output)
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and "is among the files of runs" in err
    assert (evals / "other" / "events.jsonl").read_bytes() == journal
    assert (evals / "demo" / "events.jsonl").read_bytes() == own


def test_export_writes_its_default_file_and_files_elsewhere(
    evals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "eval", "export", "demo")
    assert (code, err) == (0, "") and (evals / "demo" / "export.jsonl").is_file()
    code, _, err = _run(capsys, "eval", "export", "demo", "-o", "out/train.jsonl")
    # Not refused as a run's file; its missing directory is created, as eval report does.
    assert (code, err) == (0, "") and (tmp_path / "out" / "train.jsonl").is_file()
    code, _, err = _run(capsys, "eval", "export", "demo", "-o", "train.jsonl")
    assert (code, err) == (0, "") and (tmp_path / "train.jsonl").is_file()
    code, _, err = _run(capsys, "eval", "export", "demo", "-o", str(tmp_path))
    assert code == 1 and "is a directory" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", ["notarun", "empty"])
def test_export_of_what_is_not_a_run_says_so_as_report_does(
    evals: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    (evals / "empty").mkdir()
    code, _, export_err = _run(capsys, "eval", "export", name)
    assert code == 1
    code, _, report_err = _run(capsys, "eval", "report", name)
    assert code == 1
    assert export_err == report_err
    assert f"no run '{name}' under " in export_err and "is not a run directory" in export_err


def test_export_outside_a_workspace_says_the_argument_is_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "eval", "export", "notarun")
    assert code == 1 and err.startswith("Error: 'notarun' is not a run directory")


def test_export_of_a_run_whose_journal_is_gone_refuses_instead_of_exporting_nothing(
    evals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """index.jsonl and the rollout files hold results but events.jsonl (what export reads) is
    gone: an empty export with exit 0 would say the run had none."""
    run = evals / "other"
    (run / "index.jsonl").write_text('{"row_index": 0}\n')
    (run / "events.jsonl").unlink()
    code, out, err = _run(capsys, "eval", "export", "other", "-o", "out.jsonl")
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and "the run is damaged, and nothing was exported" in err
    assert not (tmp_path / "out.jsonl").exists()
    (run / "events.jsonl").write_bytes(b"")
    code, out, err = _run(capsys, "eval", "export", "other", "-o", "out.jsonl")
    assert code == 1 and "missing or empty" in err
    # A run that recorded nothing at all exports nothing, as before.
    (run / "index.jsonl").write_bytes(b"")
    for sub in ("rollout_trials", "trajectories", "artifacts"):
        shutil.rmtree(run / sub, ignore_errors=True)
    (run / "calls.jsonl").unlink(missing_ok=True)
    code, _, err = _run(capsys, "eval", "export", "other", "-o", "out.jsonl")
    assert (code, err) == (0, ""), err
