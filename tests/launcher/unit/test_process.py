"""launcher.process: start tokens, group termination, ownership records and orphan reaping."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from launcher.process import (
    ReapedChild,
    TunnelOwner,
    group_members,
    owner_record,
    reap_orphans,
    reap_run_dir,
    start_token,
    terminate_group,
    write_record,
)
from launcher.rundir import RunLock
from tests.fakes.cloudflared_support import REPO_ROOT, install_fake_cloudflared
from tests.fakes.upstream import FakeUpstream

RECORD_FIELDS = {"pid", "pgid", "start_token", "instance_id", "port", "created_at"}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _sleeper() -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )


def test_start_token_identifies_a_process() -> None:
    token = start_token(os.getpid())
    assert token and token.isdigit()
    assert start_token(os.getpid()) == token
    assert start_token(2**22 + 12345) is None


def test_tunnel_record_is_written_atomically_with_mode_0600(tmp_path: Path) -> None:
    owner = TunnelOwner(tmp_path / "run")
    owner.record(os.getpid(), 8123)
    path = tmp_path / "run" / "tunnel.json"
    record = json.loads(path.read_text())
    assert set(record) == RECORD_FIELDS
    assert record["pid"] == os.getpid() and record["pgid"] == os.getpgid(0)
    assert record["start_token"] == start_token(os.getpid())
    assert record["instance_id"] == "cloudflared" and record["port"] == 8123
    assert record["created_at"].endswith("Z")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["tunnel.json"]

    owner.release(os.getpid() + 1)  # not the recorded process: the record stays
    assert path.exists()
    owner.release(os.getpid())
    assert not path.exists()


async def test_a_process_that_is_gone_cannot_be_recorded(tmp_path: Path) -> None:
    process = await _sleeper()
    process.kill()
    await process.wait()
    with pytest.raises(ProcessLookupError):
        owner_record(process.pid, "cloudflared", 9000)
    with pytest.raises(ProcessLookupError):
        TunnelOwner(tmp_path).record(process.pid, 9000)
    assert not (tmp_path / "tunnel.json").exists()


async def test_reap_refuses_a_process_that_is_not_ours(tmp_path: Path) -> None:
    process = await _sleeper()
    try:
        record = {**owner_record(process.pid, "cloudflared", 9000), "start_token": "1"}
        write_record(tmp_path / "tunnel.json", record)
        with trio.fail_after(10):
            assert await reap_run_dir(tmp_path) == []
        assert alive(process.pid)
        assert not (tmp_path / "tunnel.json").exists()
    finally:
        process.kill()
        await process.wait()


async def test_reap_ignores_symlinks_and_garbage(tmp_path: Path) -> None:
    process = await _sleeper()
    try:
        elsewhere = tmp_path / "elsewhere.json"
        write_record(elsewhere, owner_record(process.pid, "cloudflared", 9000))
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "tunnel.json").symlink_to(elsewhere)
        with trio.fail_after(10):
            assert await reap_run_dir(run_dir) == []
        assert alive(process.pid)
        assert elsewhere.exists()
        assert not (run_dir / "tunnel.json").is_symlink()

        (run_dir / "tunnel.json").write_text('{"pid": "1"}')
        with trio.fail_after(10):
            assert await reap_run_dir(run_dir) == []
        assert not (run_dir / "tunnel.json").exists()
        with trio.fail_after(10):
            assert await reap_run_dir(run_dir) == []
    finally:
        process.kill()
        await process.wait()


async def test_reap_after_the_process_already_exited(tmp_path: Path) -> None:
    process = await _sleeper()
    write_record(tmp_path / "tunnel.json", owner_record(process.pid, "cloudflared", 9000))
    process.kill()
    await process.wait()
    with trio.fail_after(10):
        assert await reap_run_dir(tmp_path) == []
    assert not (tmp_path / "tunnel.json").exists()


async def test_a_killed_child_nobody_reaped_is_not_reported_as_reaped(tmp_path: Path) -> None:
    # A server killed with its supervisor is reparented to PID 1; where PID 1 does not reap
    # (some VMs and containers), it stays a zombie with its pid and start token.
    process = await _sleeper()
    write_record(tmp_path / "server.json", owner_record(process.pid, "server", 9001))
    os.kill(process.pid, signal.SIGKILL)
    with trio.fail_after(10):
        while psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE:
            await trio.sleep(0.01)
        assert await reap_run_dir(tmp_path) == []
    assert not (tmp_path / "server.json").exists()
    await process.wait()


async def test_reap_orphans_leaves_runs_whose_lock_is_held(tmp_path: Path) -> None:
    held, free = await _sleeper(), await _sleeper()
    try:
        for name, process in (("held", held), ("free", free)):
            write_record(
                tmp_path / name / "server.json", owner_record(process.pid, f"id-{name}", 9000)
            )
        with RunLock.acquire(tmp_path, "held"), trio.fail_after(20):
            reaped = await reap_orphans(tmp_path)
        assert reaped == [ReapedChild("server", free.pid, 9000)]
        assert reaped[0].note() == (
            "terminated an orphaned rollout server from a previous invocation "
            f"(pid {free.pid}, port 9000)"
        )
        assert alive(held.pid) and (tmp_path / "held" / "server.json").exists()
        assert not alive(free.pid) and not (tmp_path / "free" / "server.json").exists()
    finally:
        for process in (held, free):
            process.kill()
            await process.wait()


async def test_a_stopped_group_is_continued_so_sigterm_ends_it() -> None:
    process = await _sleeper()
    try:
        os.killpg(process.pid, signal.SIGSTOP)
        # The grace is far longer than the deadline: only SIGTERM (not SIGKILL) can end it in time.
        with trio.fail_after(10):
            assert await terminate_group(process.pid, 60.0, leader=process) is True
        assert process.returncode == -signal.SIGTERM
        assert group_members(process.pid) == []
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_orphan_left_by_a_killed_supervisor_is_reaped(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "fake-state"
    state.mkdir()
    monkeypatch.setenv("FAKE_CLOUDFLARED_STATE", str(state))
    binary = install_fake_cloudflared(tmp_path / "bin")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    port = int(fake_upstream.base_url.rsplit(":", 1)[1])
    supervisor = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.tunnel.orphan_helper", str(binary), str(port), str(run_dir)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        with trio.fail_after(30):
            assert supervisor.stdout is not None
            out = b""
            while b"\n" not in out:
                chunk = await supervisor.stdout.receive_some(4096)
                assert chunk, "helper exited before the tunnel was ready"
                out += chunk
            assert out.startswith(b"READY https://")
            supervisor.send_signal(signal.SIGKILL)
            await supervisor.wait()
    finally:
        if supervisor.returncode is None:
            supervisor.kill()
    record = json.loads((run_dir / "tunnel.json").read_text())
    assert alive(record["pid"]), "the tunnel must survive its supervisor (own session)"

    with trio.fail_after(20):
        reaped = await reap_run_dir(run_dir)
    assert reaped == [ReapedChild("tunnel", record["pid"], port)]
    assert reaped[0].note() == (
        "terminated an orphaned cloudflared tunnel from a previous invocation "
        f"(pid {record['pid']}, port {port})"
    )
    assert not alive(record["pid"])
    assert group_members(record["pgid"]) == []
    assert not (run_dir / "tunnel.json").exists()
