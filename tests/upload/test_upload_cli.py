"""``rollbridge eval upload`` against the recording stand-in of the platform: what is sent,
resume and idempotency after faults at every request (kill -9 included), the 409, the login."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import trio

from tests.upload.helpers import PROVIDER_KEY, TOKEN, client_env, ours, run, write_credentials
from tests.upload.rundir import expected_paths, make_workspace, write_finished_run
from tests.upload.standin import StandIn

pytestmark = pytest.mark.slow  # the CLI runs as a subprocess (a kill -9 must be real)

NAME = "quiet-otter-7"


@pytest.fixture
async def standin(nursery: trio.Nursery) -> StandIn:
    stand_in = StandIn(token=TOKEN)
    await nursery.start(stand_in.serve)
    return stand_in


@pytest.fixture
def setup(tmp_path: Path, standin: StandIn) -> tuple[Path, Path, dict[str, str]]:
    """(workspace, run directory, environment) with a logged-in HOME."""
    ws = make_workspace(tmp_path / "ws")
    run_dir = write_finished_run(ws / ".osmosis" / "evals", NAME)
    write_credentials(tmp_path / "home", standin.url)
    return ws, run_dir, client_env(tmp_path / "home", standin.url)


def _local_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p: (run_dir / p).read_bytes() for p in expected_paths(run_dir)}


def _puts(standin: StandIn) -> Counter[str]:
    """Complete PUT bodies received per upload path (a part counts once per file)."""
    done: Counter[str] = Counter()
    for r in standin.requests:
        if (
            r.method == "PUT"
            and r.body
            and "size" in r.body
            and r.query.get("partNumber", "1") == "1"
        ):
            done[r.route.removeprefix("/s3/{session}/")] += 1
    return done


async def test_upload_sends_the_selected_files_and_finalizes(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    done = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    envelope = done.envelope()
    assert envelope["operation"] == "eval.upload"
    result = envelope["result"]
    assert result["eval_run_id"] == "er_1"
    assert result["status"] == "finalized"
    assert result["sent_files"] == len(expected_paths(run_dir))
    assert result["git"]["identity"] == "acme/rollouts"
    assert standin.stored == _local_bytes(run_dir)
    assert set(standin.acknowledged.values()) == {1}
    routes = [r.route.split("{session}/")[-1] for r in standin.requests if r.method == "POST"]
    assert routes[0] == "/api/cli/eval-runs/imports" and routes[1] == "uploads"
    assert routes[-1] == "finalize"
    api = [r for r in standin.requests if r.method == "POST"]
    assert all(r.headers["x-osmosis-git"] == "acme/rollouts" for r in api)
    assert all("authorization" not in r.headers for r in standin.requests if r.method == "PUT")
    big = [r for r in standin.requests if r.method == "PUT" and r.route.endswith("big.bin")]
    assert [r.query["partNumber"] for r in big] == ["1", "2", "3"]


async def test_rerun_returns_the_same_run_and_sends_nothing(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    first = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert first.returncode == 0, first.stderr
    puts = len([r for r in standin.requests if r.method == "PUT"])
    second = await run(ours("eval", "upload", str(run_dir), "--json"), cwd=ws, env=env)
    assert second.returncode == 0, second.stderr
    assert second.envelope()["result"]["eval_run_id"] == first.envelope()["result"]["eval_run_id"]
    assert second.envelope()["result"]["sent_files"] == 0
    assert len([r for r in standin.requests if r.method == "PUT"]) == puts
    assert standin.requests[-1].route.endswith("/finalize")  # always called, even when finalized


@pytest.mark.parametrize(
    ("route", "when"),
    [
        ("start", "before"),
        ("uploads", "before"),
        ("complete", "before"),
        ("complete", "after"),
        ("finalize", "before"),
    ],
)
async def test_a_500_then_a_rerun_ends_in_one_import(
    setup, standin: StandIn, route: str, when: str
) -> None:
    ws, run_dir, env = setup
    standin.faults[route] = [when]
    failed = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and failed.stderr.startswith("Error: ")
    if when == "before" or route != "complete":  # a 500 (an answer lost is not one)
        assert f"Run `rollbridge eval upload {NAME}` again to resume the upload." in (failed.stderr)
    again = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert again.returncode == 0, again.stderr
    assert len(standin.imports) == 1
    assert next(iter(standin.imports.values())).status == "finalized"
    assert standin.stored == _local_bytes(run_dir)
    assert set(standin.acknowledged.values()) == {1}
    if when == "after":  # acknowledged though the answer was lost: never sent again
        assert max(_puts(standin).values()) == 1


async def test_a_connection_reset_is_not_called_a_failure_to_connect(
    setup, standin: StandIn
) -> None:
    ws, _, env = setup
    standin.faults["uploads"] = ["reset"]
    failed = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith("Error: The connection to the platform broke off ("), (
        failed.stderr
    )
    assert "Could not connect" not in failed.stderr
    assert f"Run `rollbridge eval upload {NAME}` again to resume the upload." in failed.stderr
    again = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert again.returncode == 0, again.stderr


async def test_server_validation_errors_are_one_line(setup, standin: StandIn) -> None:
    ws, _, env = setup
    standin.faults["finalize"] = ["invalid"]
    failed = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert failed.returncode == 1
    assert failed.stderr == (
        "Error: Eval import failed validation - files.index.jsonl: row 3 missing - second\n"
    )
    failed_json = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert failed_json.returncode == 0  # the rerun finalizes (the fault was for one request)


async def test_a_500_on_a_put_is_retried(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    standin.faults["put"] = ["before"]
    done = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    assert standin.stored == _local_bytes(run_dir)
    assert set(standin.acknowledged.values()) == {1}


async def test_a_reset_mid_put_is_retried(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    first = json.loads((run_dir / "index.jsonl").read_text().splitlines()[0])["rollout_id"]
    standin.reset_put.add(f"rollout_trials/{first}/artifacts/big.bin")
    done = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    resets = [r for r in standin.requests if r.body and "reset_after" in r.body]
    assert len(resets) == 1
    assert standin.stored == _local_bytes(run_dir)
    assert set(standin.acknowledged.values()) == {1}


async def test_kill_9_between_two_parts_then_rerun(setup, standin: StandIn, tmp_path: Path) -> None:
    ws, run_dir, env = setup
    killed: list[int] = []
    proc_box: list[trio.Process] = []

    def kill_before_part_2(path: str, part: int) -> None:
        if part == 2 and not killed:
            os.kill(proc_box[0].pid, signal.SIGKILL)
            killed.append(proc_box[0].pid)

    standin.on_part = kill_before_part_2
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(ours("eval", "upload", NAME), cwd=str(ws), env=env)
        proc_box.append(proc)
        assert await proc.wait() == -signal.SIGKILL
    standin.on_part = None
    acknowledged_before = dict(standin.acknowledged)
    assert acknowledged_before  # some files were acknowledged before the kill
    done = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    assert len(standin.imports) == 1
    assert standin.stored == _local_bytes(run_dir)
    assert set(standin.acknowledged.values()) == {1}
    puts = _puts(standin)
    assert all(puts[p] == 1 for p in acknowledged_before)  # acknowledged files never resent


async def test_409_without_replace_names_the_command(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    assert (await run(ours("eval", "upload", NAME), cwd=ws, env=env)).returncode == 0
    (run_dir / "logs.txt").write_text("a retried run's log\n")  # other results, same manifest
    refused = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"Error: {standin.conflict_message} Re-run it with --retry-failed, then republish with: "
        f"rollbridge eval upload {NAME} --replace\n"
    )
    replaced = await run(ours("eval", "upload", NAME, "--replace", "--json"), cwd=ws, env=env)
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.envelope()["result"]["eval_run_id"] == "er_1"  # same platform run
    assert standin.stored["logs.txt"] == b"a retried run's log\n"


async def test_missing_login_says_what_to_run(setup, standin: StandIn, tmp_path: Path) -> None:
    ws, _, env = setup
    env["HOME"] = str(tmp_path / "nobody")
    done = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert done.returncode == 1
    assert done.stderr == (
        f"Error: Not logged in to {standin.url}. "
        "Run 'osmosis auth login' (the osmosis-ai CLI) or set OSMOSIS_TOKEN.\n"
    )
    assert standin.requests == []


async def test_workspace_option_sends_the_workspace_header(setup, standin: StandIn) -> None:
    ws, _, env = setup
    done = await run(ours("eval", "upload", NAME, "--workspace", "team-a"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    api = [r for r in standin.requests if r.method == "POST"]
    assert all(r.headers["x-osmosis-workspace"] == "team-a" for r in api)
    assert all("x-osmosis-git" not in r.headers for r in api)


async def test_no_credential_reaches_a_body_file_or_output(
    setup, standin: StandIn, tmp_path: Path
) -> None:
    ws, run_dir, env = setup
    (run_dir / "logs.txt").write_text(f"key {PROVIDER_KEY} and token {TOKEN}\n")
    env["OSMOSIS_DEBUG"] = "1"
    done = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    standin.faults["start"] = ["before"]
    failed = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    for secret in (TOKEN, PROVIDER_KEY):
        assert secret not in done.stdout + done.stderr + failed.stdout + failed.stderr
        for r in standin.requests:
            sent = json.dumps(r.body) + json.dumps(
                {k: v for k, v in r.headers.items() if k != "authorization"}
            )
            assert secret not in sent
        assert all(secret.encode() not in data for data in standin.stored.values())
        for path in run_dir.rglob("*"):
            if path.is_file() and not path.is_fifo():
                assert secret.encode() not in path.read_bytes(), path
    assert standin.stored["logs.txt"] == b"key [REDACTED] and token [REDACTED]\n"
    assert oct((run_dir / "logs.txt").stat().st_mode & 0o777) == "0o600"


async def test_the_run_lock_and_an_unfinished_run_refuse(setup, standin: StandIn) -> None:
    from launcher.rundir.lock import RunLock

    ws, run_dir, env = setup
    with RunLock.acquire(run_dir.parent, NAME):
        held = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert held.returncode == 1
    lock = run_dir.parent / ".locks" / f"{NAME}.lock"
    assert held.stderr == (
        "Error: another `rollbridge eval run` or `rollbridge eval upload` of this run holds "
        f"{lock}; wait for it to finish, then retry.\n"
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["eval_run"]["status"] = "running"
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    unfinished = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert unfinished.stderr == (
        "Error: local evaluation is not completed: metrics.json status must be finished\n"
    )
    assert standin.requests == []


async def test_uploads_are_asked_for_in_batches_of_100(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    first = json.loads((run_dir / "index.jsonl").read_text().splitlines()[0])["rollout_id"]
    many = run_dir / "rollout_trials" / first / "artifacts" / "many"
    many.mkdir()
    for i in range(130):
        (many / f"{i:03d}.txt").write_text(f"{i}\n")
    done = await run(ours("eval", "upload", NAME, "--json"), cwd=ws, env=env)
    assert done.returncode == 0, done.stderr
    batches = [r.body["paths"] for r in standin.requests if r.route.endswith("/uploads")]
    assert [len(b) for b in batches] == [100, len(expected_paths(run_dir)) + 130 - 100]
    assert [p for b in batches for p in b] == sorted(p for b in batches for p in b)
    assert len(standin.stored) == len(expected_paths(run_dir)) + 130


async def test_a_manifest_mismatch_409_gets_no_replace_advice(setup, standin: StandIn) -> None:
    ws, run_dir, env = setup
    assert (await run(ours("eval", "upload", NAME), cwd=ws, env=env)).returncode == 0
    manifest = run_dir / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=2))  # other bytes
    refused = await run(ours("eval", "upload", NAME), cwd=ws, env=env)
    assert refused.returncode == 1
    assert refused.stderr == (
        "Error: The manifest digest differs from the imported run. The run's manifest.json "
        "differs from the one imported for this local run; --replace cannot change it.\n"
    )


async def test_the_scope_is_the_runs_workspace_not_the_cwd(
    setup, standin: StandIn, tmp_path: Path
) -> None:
    _, run_dir, env = setup
    other = make_workspace(tmp_path / "other", "https://github.com/Other/Repo")
    done = await run(ours("eval", "upload", str(run_dir), "--json"), cwd=other, env=env)
    assert done.returncode == 0, done.stderr
    assert done.envelope()["result"]["git"]["identity"] == "acme/rollouts"
    api = [r for r in standin.requests if r.method == "POST"]
    assert {r.headers["x-osmosis-git"] for r in api} == {"acme/rollouts"}


async def test_what_is_not_a_run_is_left_untouched(setup, standin: StandIn, tmp_path: Path) -> None:
    ws, _, env = setup
    stray = tmp_path / "notarun"
    stray.mkdir()
    (stray / "logs.txt").write_text(f"key {PROVIDER_KEY}\n")
    done = await run(ours("eval", "upload", str(stray), "--workspace", "t"), cwd=ws, env=env)
    assert done.returncode == 1
    assert done.stderr == f"Error: {stray} is not a run directory (no manifest.json)\n"
    assert (stray / "logs.txt").read_text() == f"key {PROVIDER_KEY}\n"
    assert not (tmp_path / ".locks").exists()
    assert [p.name for p in stray.iterdir()] == ["logs.txt"]
    empty = await run(ours("eval", "upload", ""), cwd=stray, env=env)
    assert empty.returncode == 2 and "RUN must be a run name or a run directory" in empty.stderr
    assert (stray / "logs.txt").read_text() == f"key {PROVIDER_KEY}\n"
    assert standin.requests == []
