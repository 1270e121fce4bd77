"""tunnel.json ownership records and reaping an orphaned cloudflared after a kill -9."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import trio

from tests.fakes.cloudflared_support import REPO_ROOT
from tests.fakes.upstream import FakeUpstream
from tests.tunnel.conftest import FakeCloudflared, alive
from tunnel import ReapedTunnel, read_start_token, reap_orphan_tunnel
from tunnel.record import group_members, make_tunnel_record, write_record_atomic


def test_start_token_identifies_a_process() -> None:
    token = read_start_token(os.getpid())
    assert token and token.isdigit()
    assert read_start_token(os.getpid()) == token
    assert read_start_token(2**22 + 12345) is None


def test_record_is_written_atomically_with_mode_0600(tmp_path: Path) -> None:
    record = make_tunnel_record(os.getpid(), 8123)
    path = tmp_path / "run" / "tunnel.json"
    write_record_atomic(path, record)
    assert json.loads(path.read_text()) == asdict(record)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["tunnel.json"]
    assert record.instance_id == "cloudflared" and record.port == 8123


async def _sleeper() -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )


async def test_reap_refuses_a_process_that_is_not_ours(tmp_path: Path) -> None:
    process = await _sleeper()
    try:
        record = replace(make_tunnel_record(process.pid, 9000), start_token="1")
        write_record_atomic(tmp_path / "tunnel.json", record)
        with trio.fail_after(10):
            assert await reap_orphan_tunnel(tmp_path, grace=0.5) is None
        assert alive(process.pid)
        assert not (tmp_path / "tunnel.json").exists()
    finally:
        process.kill()
        await process.wait()


async def test_reap_ignores_symlinks_and_garbage(tmp_path: Path) -> None:
    process = await _sleeper()
    try:
        elsewhere = tmp_path / "elsewhere.json"
        write_record_atomic(elsewhere, make_tunnel_record(process.pid, 9000))
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "tunnel.json").symlink_to(elsewhere)
        with trio.fail_after(10):
            assert await reap_orphan_tunnel(run_dir, grace=0.5) is None
        assert alive(process.pid)
        assert elsewhere.exists()
        assert not (run_dir / "tunnel.json").is_symlink()

        (run_dir / "tunnel.json").write_text('{"pid": "1"}')
        with trio.fail_after(10):
            assert await reap_orphan_tunnel(run_dir) is None
        assert not (run_dir / "tunnel.json").exists()
        with trio.fail_after(10):
            assert await reap_orphan_tunnel(run_dir) is None
    finally:
        process.kill()
        await process.wait()


async def test_reap_after_the_process_already_exited(tmp_path: Path) -> None:
    process = await _sleeper()
    write_record_atomic(tmp_path / "tunnel.json", make_tunnel_record(process.pid, 9000))
    process.kill()
    await process.wait()
    with trio.fail_after(10):
        assert await reap_orphan_tunnel(tmp_path) is None
    assert not (tmp_path / "tunnel.json").exists()


async def test_orphan_left_by_a_killed_supervisor_is_reaped(
    fake_upstream: FakeUpstream, fake_cloudflared: FakeCloudflared, run_dir: Path
) -> None:
    port = int(fake_upstream.base_url.rsplit(":", 1)[1])
    supervisor = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "tests.tunnel.orphan_helper",
            str(fake_cloudflared.binary),
            str(port),
            str(run_dir),
        ],
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
        reaped = await reap_orphan_tunnel(run_dir, grace=2.0)
    assert reaped == ReapedTunnel(pid=record["pid"], port=port)
    assert reaped.message == (
        "terminated an orphaned cloudflared tunnel from a previous invocation "
        f"(pid {record['pid']}, port {port})"
    )
    assert not alive(record["pid"])
    assert group_members(record["pgid"]) == []
    assert not (run_dir / "tunnel.json").exists()
