"""Resume after ``kill -9`` of the supervisor, ``--fresh``, ``--retry-failed`` and the
``Changed: ...`` refusal, with real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import (
    bridge_child_pid,
    count_log,
    fake_model_config,
    journal,
    metrics,
    process_gone,
    processes_in_group,
    run_cli,
    run_dir,
    server_record,
    start_cli,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow

CONFIG = "ws/configs/eval/echo.toml"
SUMMARY_KEYS = ("total_samples", "completed_samples", "graded", "passed", "failed", "skipped")
UNINTERRUPTED = {
    "total_samples": 21,
    "completed_samples": 20,
    "graded": 19,
    "passed": 16,
    "failed": 1,
    "skipped": 1,
}


def _fake_env(env: dict[str, str], upstream: FakeUpstream) -> dict[str, str]:
    return {**env, "OPENAI_BASE_URL": upstream.v1, "OPENAI_API_KEY": "sk-fake-resume-key"}


@pytest.mark.parametrize("point", ["startup", "dispatch"])
async def test_kill_9_then_resume_keeps_every_acknowledged_result(
    point: str,
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    no_orphans: list[int],
) -> None:
    write_config(workspace, "slow", fake_model_config(batch_size=2))
    fake_upstream.delay = 0.15
    run_env = _fake_env(env, fake_upstream)
    args = ["eval", "run", "ws/configs/eval/slow.toml", "--name", "k9", "--yes"]
    run = run_dir(workspace, "k9")
    live = await start_cli(args, cwd=tmp_path, env=run_env, logdir=tmp_path / "first")
    if point == "startup":
        await wait_for(lambda: server_record(run) is not None)
    else:
        await wait_for(lambda: count_log(run, "work item finished") >= 5)
    record = server_record(run)
    bridge = bridge_child_pid(live.process.pid)  # started ahead: there from the first moment
    assert bridge is not None
    live.kill9()
    await live.wait()
    # The bridge's process does not survive its supervisor (it stops on its socket's EOF).
    await wait_for(lambda: process_gone(bridge))
    acknowledged = journal(run)
    assert record is not None
    no_orphans.append(record["pgid"])
    if point == "dispatch":
        # The serving rollout server sees its supervisor gone and shuts down by itself (its
        # own session keeps it from the kill, not from noticing it).
        await wait_for(lambda: not processes_in_group(record["pgid"]), timeout=60)

    fake_upstream.delay = 0.0
    again = await run_cli(args, cwd=tmp_path, env=run_env)
    assert again.returncode == 0, again.stderr + again.stdout
    # One killed before it began to serve is proved ours and stopped by the next invocation.
    orphan = "terminated an orphaned rollout server from a previous invocation"
    assert point == "startup" or orphan not in again.stdout
    assert not processes_in_group(record["pgid"])
    records = journal(run)
    assert records[: len(acknowledged)] == acknowledged
    keys = [(r["row_index"], r["run_index"]) for r in records]
    assert len(keys) == len(set(keys)) == 21
    summary = metrics(run)["summary"]
    assert {k: summary[k] for k in SUMMARY_KEYS} == UNINTERRUPTED
    assert summary["tokens_used"] == sum(r.get("tokens", 0) for r in records)
    if point == "dispatch":
        assert (
            f"{21 - len(acknowledged)} of 21 work items pending, {len(acknowledged)} already recorded"
            in again.stdout
        )


async def test_fresh_archives_and_retry_failed_keeps_successes(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", CONFIG, "--name", "rf", "--yes"]
    first = await run_cli(args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    run = run_dir(workspace, "rf")
    before = journal(run)

    retried = await run_cli([*args, "--retry-failed"], cwd=tmp_path, env=env)
    assert retried.returncode == 0, retried.stderr
    assert "rf: 2 of 21 work items pending, 21 already recorded" in retried.stdout
    after = journal(run)
    assert after[:21] == before and len(after) == 23
    retried_keys = {(r["row_index"], r["run_index"]) for r in after[21:]}
    assert retried_keys == {(18, 0), (20, 0)}
    assert len((run / "index.jsonl").read_text().splitlines()) == 21
    assert all(r["rollout_id"] not in {b["rollout_id"] for b in before} for r in after[21:])

    fresh = await run_cli([*args, "--fresh"], cwd=tmp_path, env=env)
    assert fresh.returncode == 0, fresh.stderr
    archives = sorted(p for p in run.parent.iterdir() if p.name.startswith("rf.archive-"))
    assert len(archives) == 1
    assert f"archived previous results to {archives[0]}" in fresh.stdout
    assert journal(archives[0]) == after
    assert len(journal(run)) == 21
    assert (archives[0] / "manifest.json").read_text() != (run / "manifest.json").read_text()


async def test_changed_inputs_are_refused_without_touching_the_run(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", CONFIG, "--name", "ch", "--yes"]
    first = await run_cli(args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    run = run_dir(workspace, "ch")
    snapshot = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    main = workspace / "rollouts" / "echo" / "main.py"
    main.write_text(main.read_text() + "\n# a change to the rollout source\n")
    refused = await run_cli(args, cwd=tmp_path, env=env)
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("Error: run 'ch' was created with different resolved inputs")
    assert "Changed: rollout." in lines[0] and "--fresh" in lines[0]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == snapshot
    assert "Traceback" not in refused.stderr

    # .venv and uv.lock never count as source changes.
    main.write_text(main.read_text().replace("\n# a change to the rollout source\n", ""))
    (workspace / "rollouts" / "echo" / "uv.lock").write_text("# lock\n")
    ok = await run_cli(args, cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "rollouts" not in ok.stderr


async def test_any_later_run_reaps_an_orphan_of_another_name(
    workspace: Path,
    env: dict[str, str],
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    no_orphans: list[int],
) -> None:
    write_config(workspace, "slow", fake_model_config(batch_size=2))
    # A server that does not watch for its supervisor (an older SDK, another tool's): a server
    # of this SDK shuts down by itself when its supervisor dies (test_kill_9_then_resume...).
    main = workspace / "rollouts" / "echo" / "main.py"
    forget = '    __import__("os").environ.pop("_ROLLBRIDGE_SUPERVISOR_PID", None)\n'
    text = main.read_text()
    main.write_text(
        text.replace('\nif __name__ == "__main__":\n', f'\nif __name__ == "__main__":\n{forget}')
    )
    fake_upstream.delay = 0.2
    run_env = _fake_env(env, fake_upstream)
    run = run_dir(workspace, "gone")
    live = await start_cli(
        ["eval", "run", "ws/configs/eval/slow.toml", "--name", "gone", "--yes"],
        cwd=tmp_path,
        env=run_env,
        logdir=tmp_path / "first",
    )
    await wait_for(lambda: count_log(run, "work item finished") >= 1)
    record = server_record(run)
    assert record is not None
    no_orphans.append(record["pgid"])
    live.kill9()
    await live.wait()
    assert processes_in_group(record["pgid"])

    other = await run_cli(
        ["eval", "run", CONFIG, "--name", "other", "--yes", "--rows", "0-1"],
        cwd=tmp_path,
        env=env,
    )
    assert other.returncode == 0, other.stderr
    assert (
        f"terminated an orphaned rollout server from a previous invocation (pid {record['pid']}, port {record['port']})"
        in other.stdout
    )
    assert not processes_in_group(record["pgid"])
    assert not (run / "server.json").exists()
