"""``-o`` of ``eval report``, ``eval diff``, ``eval export`` and ``eval rubric``
(launcher.outputs): never a run's own file, even through a symlink; a FIFO or device written
into, never replaced; a trailing ``/`` refused; no temporary file left behind; parents made;
``eval rubric`` checks its ``-o`` before any (paid) judge call."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from launcher.errors import LocalEvalError
from launcher.outputs import check_writable, output_path, refuse_run_files, write_output
from launcher.reporting.commands import write_page
from tests.launcher.test_export import _trajectory
from tests.launcher.test_runs import _run, make_run, ok
from tests.rubric.conftest import Outcome, invoke
from tests.rubric.conftest import judge as judge  # the fake judge fixture, shared
from tests.rubric.fake_judge import FakeJudge

RUN_FILES = ("events.jsonl", "manifest.json")
JUDGE = ("-r", "Score 1 when right.", "--model", "openai/fake-judge")


@pytest.fixture
def evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace (the cwd) with two runs, ``base`` and ``victim``, each with a trajectory."""
    ws = tmp_path / "ws"
    (ws / "configs" / "eval").mkdir(parents=True)
    monkeypatch.chdir(ws)
    root = ws / ".osmosis" / "evals"
    for name in ("base", "victim"):
        run = make_run(root, name, records=[ok(0)], total=1)
        _trajectory(run, "r0", "fruit")
    return root


def _digests(run: Path) -> dict[str, str]:
    return {n: hashlib.sha256((run / n).read_bytes()).hexdigest() for n in RUN_FILES}


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


def _command(name: str, output: str) -> list[str]:
    return {
        "report": ["eval", "report", "base", "-o", output],
        "diff": ["eval", "diff", "base", "base", "-o", output],
        "export": ["eval", "export", "base", "-o", output],
        "rubric": ["eval", "rubric", "--run", "base", *JUDGE, "-o", output],
    }[name]


async def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    """The CLI in a worker thread (``eval rubric`` runs its own trio loop)."""
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(lambda: invoke(capsys, *args))


# -- the shared module -------------------------------------------------------------------------


def test_output_path_refuses_a_directory_and_a_trailing_slash(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for value in ("d", "d/", str(tmp_path / "d")):
        with pytest.raises(LocalEvalError, match="is a directory; -o takes the file to write"):
            output_path(value, tmp_path)
    with pytest.raises(LocalEvalError, match=r"-o new/ ends with '/': give the file to write"):
        output_path("new/", tmp_path)
    assert output_path("new/x.html", tmp_path) == tmp_path / "new" / "x.html"
    assert not (tmp_path / "new").exists()


def test_refuse_run_files_resolves_symlinks_and_keeps_allowed_names(
    evals: Path, tmp_path: Path
) -> None:
    victim = evals / "victim"
    link = tmp_path / "t" / "vdir"
    link.parent.mkdir()
    link.symlink_to(victim)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for target in (victim / "events.jsonl", victim / "manifest.json", link / "index.jsonl"):
        with pytest.raises(LocalEvalError, match="is among the files of runs"):
            refuse_run_files(target, cwd=outside, runs=[victim])
    refuse_run_files(link / "report.html", cwd=outside, allowed=[victim / "report.html"])
    refuse_run_files(outside / "events.jsonl", cwd=outside, runs=[victim])


def test_write_output_makes_parents_and_keeps_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "x.jsonl"
    assert write_output(target, b"one\n") == target
    assert target.read_bytes() == b"one\n"
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert write_output(link, b"two\n") == target
    assert link.is_symlink() and target.read_bytes() == b"two\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.jsonl"]


def test_a_failed_write_leaves_no_temporary_file_and_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    target.mkdir()  # os.replace onto a directory fails after the temporary file was written
    with pytest.raises(LocalEvalError) as failed:
        write_page(target, "<html>" * 1000)
    assert str(failed.value) == f"cannot write {target}: Is a directory"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]
    assert list(target.iterdir()) == []


def test_a_temporary_name_of_another_writer_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    other = tmp_path / ".page.html.tmp"  # what another writer's temporary file was named
    other.write_text("another writer's half page")
    write_page(target, "<html>mine</html>")
    assert target.read_text() == "<html>mine</html>"
    assert other.read_text() == "another writer's half page"


def test_check_writable_before_the_work(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(LocalEvalError, match=f"cannot write .*: {afile} is not a directory"):
        check_writable(afile / "x.json")
    check_writable(tmp_path / "made" / "x.json")
    assert list((tmp_path / "made").iterdir()) == []  # the probe is gone
    with pytest.raises(LocalEvalError, match="is a directory"):
        check_writable(tmp_path / "made")
    if Path("/proc/self").is_dir():
        with pytest.raises(LocalEvalError, match=r"cannot write /proc/nope/x\.json: "):
            check_writable(Path("/proc/nope/x.json"))


def _is_null_device(path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


@pytest.fixture
def null_device(tmp_path: Path) -> Path:
    """A private node of the null device (what /dev/null is), so a defect replaces it rather
    than the system's; the system's /dev/null when no node can be made."""
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (OSError, AttributeError):
        node = Path("/dev/null")
    if not _is_null_device(node):
        pytest.skip(f"{node} is not the null device")
    return node


def test_a_device_is_written_into_not_replaced(null_device: Path) -> None:
    assert write_output(null_device, b"gone\n") == null_device
    assert _is_null_device(null_device)


@pytest.mark.skipif(not _is_null_device(Path("/dev/null")), reason="/dev/null is no device here")
def test_dev_null_is_written_into_not_replaced() -> None:
    assert write_output(Path("/dev/null"), b"gone\n") == Path("/dev/null")
    assert _is_null_device(Path("/dev/null"))


async def _read_fifo(fifo: Path, write: Callable[[], Any]) -> bytes:
    """Run ``write`` (which writes into ``fifo``) while a reader thread reads the FIFO."""
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as fh:
            got.append(fh.read())

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: trio.to_thread.run_sync(read, abandon_on_cancel=True))
            await trio.to_thread.run_sync(write, abandon_on_cancel=True)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced"
    return got[0]


async def test_a_fifo_is_written_into(tmp_path: Path) -> None:
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    data = await _read_fifo(fifo, lambda: write_output(fifo, b"a\nb\n"))
    assert data == b"a\nb\n"
    assert [p.name for p in await trio.Path(tmp_path).iterdir()] == ["f.jsonl"]


async def test_a_failed_write_into_a_fifo_is_one_error_naming_it(tmp_path: Path) -> None:
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    failed: list[LocalEvalError] = []

    def write() -> None:
        try:
            write_output(fifo, b"x" * (1 << 22))  # more than a pipe holds: the reader is gone
        except LocalEvalError as exc:
            failed.append(exc)

    def hang_up() -> None:
        os.close(os.open(fifo, os.O_RDONLY))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: trio.to_thread.run_sync(hang_up, abandon_on_cancel=True))
            await trio.to_thread.run_sync(write, abandon_on_cancel=True)
    assert [str(exc) for exc in failed] == [f"cannot write {fifo}: Broken pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# -- the four commands -------------------------------------------------------------------------


def _targets(evals: Path, tmp_path: Path) -> list[str]:
    link = tmp_path / "t" / "vdir"
    link.parent.mkdir(exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(evals / "victim")
    return [
        ".osmosis/evals/victim/events.jsonl",
        ".osmosis/evals/victim/manifest.json",
        str(link / "index.jsonl"),
        str(link / "events.jsonl"),
    ]


@pytest.mark.parametrize("command", ["report", "diff", "export"])
def test_no_command_writes_a_run_file(
    evals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    before = _digests(evals / "victim")
    for target in _targets(evals, tmp_path):
        code, out, err = _run(capsys, *_command(command, target))
        assert code == 1 and out == ""
        assert "is among the files of runs" in _one_line(err)
    assert _digests(evals / "victim") == before
    assert not (evals / "victim" / "index.jsonl").exists()


async def test_rubric_refuses_a_run_file_before_any_judge_call(
    judge: FakeJudge, evals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digests(evals / "victim")
    for target in _targets(evals, tmp_path):
        outcome = await _cli(capsys, *_command("rubric", target))
        assert outcome.code == 1
        assert "is among the files of runs" in _one_line(outcome.err)
    assert judge.requests == []
    assert _digests(evals / "victim") == before


@pytest.mark.parametrize(
    ("command", "name"),
    [("report", "report.html"), ("export", "export.jsonl"), ("export", "export.parquet")],
)
def test_a_command_may_write_its_own_default_file(
    evals: Path, capsys: pytest.CaptureFixture[str], command: str, name: str
) -> None:
    target = evals / "base" / name
    args = _command(command, str(target))
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
        args += ["--format", "parquet"]
    code, _, err = _run(capsys, *args)
    assert (code, err) == (0, "") and target.stat().st_size > 0


def test_diff_writes_its_default_page(evals: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "eval", "diff", "base", "victim")
    assert (code, err) == (0, "") and Path("diff-base-vs-victim.html").is_file()


async def test_rubric_may_write_its_report_into_the_judged_run(
    judge: FakeJudge, evals: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = await _cli(capsys, *_command("rubric", ".osmosis/evals/base/"))
    assert outcome.code == 0, outcome.err
    report = json.loads((evals / "base" / "rubric_eval_result.json").read_text())
    assert len(report["records"]) == 1


@pytest.mark.parametrize(
    "output",
    [
        "/proc/nope/x.json",
        "afile/x.json",
        "afile",  # replacing a file is fine, but afile/ would be a directory
        ".osmosis/evals/victim/",  # rubric_eval_result.json of a run it does not judge
    ],
)
async def test_rubric_checks_its_output_before_any_judge_call(
    judge: FakeJudge, evals: Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    await trio.Path("afile").write_text("mine")
    output = output + "/" if output == "afile" else output
    outcome = await _cli(capsys, *_command("rubric", output), "--json")
    assert outcome.code == 1
    assert judge.requests == []
    assert await trio.Path("afile").read_text() == "mine"
    error = json.loads(outcome.out.strip().splitlines()[-1]) if outcome.out.strip() else {}
    assert error.get("error", {}).get("code") != "INTERNAL", outcome.out
    assert "Traceback" not in outcome.err


@pytest.mark.parametrize("command", ["report", "diff", "export"])
def test_a_trailing_slash_is_refused(
    evals: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, err = _run(capsys, *_command(command, "newdir/"))
    assert code == 1 and out == ""
    assert _one_line(err) == "Error: -o newdir/ ends with '/': give the file to write"
    assert not Path("newdir").exists()


@pytest.mark.parametrize("command", ["report", "diff", "export"])
def test_missing_parents_are_created(
    evals: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, _, err = _run(capsys, *_command(command, "new/dir/x.out"))
    assert (code, err) == (0, "")
    assert [p.name for p in Path("new/dir").iterdir()] == ["x.out"]


def test_a_failed_parquet_write_names_the_given_path(
    evals: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pyarrow")
    Path("afile").write_text("mine")
    code, _, err = _run(capsys, *_command("export", "afile/x.parquet"), "--format", "parquet")
    assert code == 1
    line = _one_line(err)
    assert f"cannot write {Path.cwd() / 'afile' / 'x.parquet'}: " in line and ".tmp" not in line


@pytest.mark.parametrize("command", ["report", "diff", "export"])
def test_a_device_stays_a_device(
    evals: Path, null_device: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, err = _run(capsys, *_command(command, str(null_device)))
    assert (code, err) == (0, "") and str(null_device) in out
    assert _is_null_device(null_device)


@pytest.mark.parametrize("command", ["report", "export"])
async def test_a_fifo_gets_the_output(
    evals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    fifo = tmp_path / "f.out"
    os.mkfifo(fifo)
    done: list[Outcome] = []
    data = await _read_fifo(
        fifo, lambda: done.append(invoke(capsys, *_command(command, str(fifo))))
    )
    assert done[0].code == 0, done[0].err
    if command == "export":
        assert [json.loads(line)["rollout_id"] for line in data.splitlines()] == ["r0"]
    else:
        assert b"<html" in data


@pytest.mark.parametrize("command", ["report", "diff", "export"])
def test_no_command_writes_the_daemons_files(
    evals: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Everything under the workspace's .osmosis (the daemon's token and lock, its run
    records) is refused like the runs' own files: overwriting daemon.json lost the token."""
    osmosis = evals.parent
    (osmosis / "daemon" / "runs").mkdir(parents=True)
    files = [osmosis / "daemon.json", osmosis / "daemon.lock", osmosis / "daemon/runs/x.json"]
    for path in files:
        path.write_text("{}")
    for path in files:
        code, out, err = _run(
            capsys, *_command(command, str(path.relative_to(evals.parent.parent)))
        )
        assert code == 1 and out == ""
        assert "is among the files of runs" in _one_line(err)
        assert path.read_text() == "{}"
