"""The managed tunnel against the fake cloudflared: real processes, real HTTP through the tunnel."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from launcher.process import group_members, start_token
from tests.fakes.cloudflared_support import fake_info
from tests.fakes.upstream import FakeUpstream
from tests.tunnel.conftest import FakeCloudflared, Recorder, alive, fake_processes
from tunnel import (
    RATE_LIMIT_MESSAGE,
    TunnelFailed,
    TunnelHandle,
    TunnelOptions,
    TunnelRateLimited,
    TunnelStartError,
    run_cloudflared_tunnel,
)

MakeOptions = Callable[..., TunnelOptions]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "through the tunnel"}]}


def _port(upstream: FakeUpstream) -> int:
    return int(upstream.base_url.rsplit(":", 1)[1])


async def _chat(fake: FakeCloudflared, base_url: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=fake.transport(), timeout=10) as client:
        return await client.post(base_url + "/v1/chat/completions", json=CHAT)


async def test_tunnel_forwards_real_traffic_and_cleans_up(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
    recorder: Recorder,
) -> None:
    with trio.fail_after(30):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream))
        )
        url = handle.public_url
        assert url.startswith("https://") and url.endswith(".trycloudflare.com")
        assert handle.available and handle.generation == 1
        assert await handle.wait_available() == url

        info = fake_info(fake_cloudflared.state, url)
        assert info["argv"] == [
            "tunnel",
            "--config",
            "/dev/null",
            "--no-autoupdate",
            "--url",
            f"http://127.0.0.1:{_port(fake_upstream)}",
        ]
        record_path = run_dir / "tunnel.json"
        record = json.loads(record_path.read_text())
        assert record == {
            "pid": handle.pid,
            "pgid": handle.pid,
            "start_token": start_token(handle.pid or 0),
            "instance_id": "cloudflared",
            "port": _port(fake_upstream),
            "created_at": record["created_at"],
        }
        assert record["created_at"].endswith("Z")
        assert stat.S_IMODE(record_path.stat().st_mode) == 0o600
        assert os.getpgid(handle.pid or 0) == handle.pid != os.getpgid(0)

        response = await _chat(fake_cloudflared, url)
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "echo: through the tunnel"
        assert fake_upstream.requests[-1].path == "/v1/chat/completions"

        pid = handle.pid or 0
        handle.stop()
        await handle.wait_closed()
    assert handle.stop_confirmed is True
    assert not alive(pid)
    assert not record_path.exists()
    assert recorder.milestones[:2] == ["starting cloudflared quick tunnel", f"tunnel ready: {url}"]
    cloudflared_lines = recorder.messages("cloudflared")
    assert any("Registered tunnel connection" in line for line in cloudflared_lines)
    assert any(url in line for line in cloudflared_lines)


async def test_stderr_is_drained_and_redacted_for_the_whole_life(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    recorder: Recorder,
) -> None:
    # 400 KB of log output after startup: far more than a pipe buffer. If stderr were not
    # drained, the fake would block on write and stop forwarding.
    fake_cloudflared.knobs(NOISE="4000")
    options = make_options(_port(fake_upstream), redact=lambda s: s.replace("fake01", "[REDACTED]"))
    with trio.fail_after(30):
        handle: TunnelHandle = await nursery.start(run_cloudflared_tunnel, options)
        while len(recorder.messages("cloudflared")) < 4000:
            await trio.sleep(0.05)
        response = await _chat(fake_cloudflared, handle.public_url)
        assert response.status_code == 200
        handle.stop()
        await handle.wait_closed()
    lines = recorder.messages("cloudflared")
    assert any("location=[REDACTED]" in line for line in lines)
    assert not any("fake01" in line for line in lines)


async def test_readiness_through_the_public_probe_without_registration(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
) -> None:
    fake_cloudflared.knobs(REGISTER="0")
    with trio.fail_after(30):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream))
        )
        # The probe hit the bare root through the tunnel; the origin's 404 proved readiness.
        assert any(r.path == "/" and r.method == "GET" for r in fake_upstream.requests)
        handle.stop()
        await handle.wait_closed()


QUICK_TUNNEL_DOCS = (
    "https://developers.cloudflare.com/cloudflare-one/networks/connectors/cloudflare-tunnel/"
    "do-more-with-tunnels/trycloudflare/"
)


@pytest.mark.parametrize(
    ("knobs", "start_timeout", "error", "message"),
    [
        pytest.param(
            {"REGISTER": "0", "EDGE_READY": "0"},
            1.5,
            TunnelStartError,
            "cloudflared published a tunnel URL, but it neither registered a connection nor "
            "passed this host's readiness check within 1.5s; last readiness failure: HTTP 502. "
            "Retry, or run your own tunnel and pass --advertise-url. Quick-tunnel documentation: "
            + QUICK_TUNNEL_DOCS,
            id="readiness-timeout-reports-the-last-probe-failure",
        ),
        pytest.param(
            {"URL_DELAY": "30"},
            1.0,
            TunnelStartError,
            "cloudflared did not publish a trycloudflare.com URL within 1s; "
            "see the run log for its output",
            id="no-url-within-the-budget",
        ),
        pytest.param(
            {"RATE_LIMIT": "1"}, 20.0, TunnelRateLimited, RATE_LIMIT_MESSAGE, id="rate-limit"
        ),
        pytest.param(
            {"EXIT_BEFORE_URL": "3"},
            20.0,
            TunnelStartError,
            "cloudflared exited with code 3 before publishing a tunnel URL",
            id="exit-before-url-is-not-fooled-by-the-api-url",
        ),
        pytest.param(
            {"EXIT_AFTER_URL": "4"},
            20.0,
            TunnelStartError,
            "cloudflared exited with code 4 before the tunnel became reachable",
            id="exit-after-url-before-reachable",
        ),
    ],
)
async def test_startup_failure_is_one_line_and_leaves_nothing_behind(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
    knobs: dict[str, str],
    start_timeout: float,
    error: type[TunnelStartError],
    message: str,
) -> None:
    fake_cloudflared.knobs(**knobs)
    options = make_options(_port(fake_upstream), start_timeout=start_timeout)
    with trio.fail_after(30), pytest.raises(error) as info:
        await nursery.start(run_cloudflared_tunnel, options)
    assert str(info.value) == message
    assert "\n" not in message
    assert not (run_dir / "tunnel.json").exists()
    assert fake_processes(fake_cloudflared.binary) == []


def test_rate_limit_message_names_the_cause() -> None:
    assert RATE_LIMIT_MESSAGE.startswith(
        "Cloudflare is rate-limiting quick-tunnel creation for this network (HTTP 429)."
    )


async def test_spawn_failure(
    nursery: trio.Nursery, tmp_path: Path, make_options: MakeOptions
) -> None:
    not_executable = tmp_path / "cloudflared-text"
    not_executable.write_text("plain file")
    with trio.fail_after(10), pytest.raises(TunnelStartError) as info:
        await nursery.start(run_cloudflared_tunnel, make_options(1, binary=not_executable))
    assert str(info.value).startswith("could not start cloudflared: ")


async def test_crash_restarts_with_a_new_url(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
    recorder: Recorder,
) -> None:
    fake_cloudflared.knobs(CRASH_AFTER_REQUESTS="1,0")
    with trio.fail_after(40):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream))
        )
        first_url, first_pid = handle.public_url, handle.pid or 0
        assert (await _chat(fake_cloudflared, first_url)).status_code == 200
        second_url = await handle.wait_url_change(1)
        assert second_url != first_url
        assert handle.public_url == second_url
        assert handle.generation == 2 and handle.restarts == 1
        assert not alive(first_pid)
        response = await _chat(fake_cloudflared, second_url)
        assert response.status_code == 200
        record = json.loads((run_dir / "tunnel.json").read_text())
        assert record["pid"] == handle.pid != first_pid
        handle.stop()
        await handle.wait_closed()
    assert any(
        m.startswith("the cloudflared tunnel exited with code 1; restarting it (attempt 1 of 3)")
        for m in recorder.milestones
    )
    assert any(
        m.startswith(f"tunnel ready again: {second_url} (restart 1)") for m in recorder.milestones
    )
    tunnel_log = recorder.messages("tunnel")
    assert "cloudflared tunnel restarted" in tunnel_log
    assert handle.failure is None


async def test_a_tunnel_that_stops_answering_is_replaced(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    recorder: Recorder,
) -> None:
    fake_cloudflared.knobs(DISCONNECT_AFTER="0.3,0")
    with trio.fail_after(40):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream))
        )
        first_pid = handle.pid or 0
        new_url = await handle.wait_url_change(1)
        assert not alive(first_pid)  # alive but unresponsive: it was stopped, not left behind
        assert (await _chat(fake_cloudflared, new_url)).status_code == 200
        handle.stop()
        await handle.wait_closed()
    assert any(
        m.startswith("the cloudflared tunnel stopped answering (HTTP 503); restarting it")
        for m in recorder.milestones
    )


async def test_restarts_exhausted_report_one_line_failure(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
    recorder: Recorder,
) -> None:
    # The first process crashes; every restart is refused by Cloudflare's rate limit.
    fake_cloudflared.knobs(CRASH_AFTER_REQUESTS="1", RATE_LIMIT="0,1")
    with trio.fail_after(40):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream), max_restarts=2)
        )
        await _chat(fake_cloudflared, handle.public_url)
        reason = await handle.wait_failed()
        await handle.wait_closed()
    assert reason.startswith(
        "the cloudflared tunnel exited with code 1; 2 restart attempt(s) failed (last: "
        "Cloudflare is rate-limiting"
    )
    assert reason.endswith("; sandboxes can no longer reach the model bridge")
    assert "\n" not in reason
    assert handle.failure == reason and not handle.available
    with pytest.raises(TunnelFailed, match="rate-limiting"):
        await handle.wait_available()
    assert fake_cloudflared.spawns() == 3
    assert not (run_dir / "tunnel.json").exists()
    assert ("ERROR", "tunnel", reason, None) in recorder.lines


async def test_without_self_healing_the_reference_message_is_kept(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
) -> None:
    fake_cloudflared.knobs(CRASH_AFTER_REQUESTS="1")
    with trio.fail_after(30):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream), max_restarts=0)
        )
        await _chat(fake_cloudflared, handle.public_url)
        reason = await handle.wait_failed()
    assert reason == (
        "the cloudflared tunnel exited with code 1; sandboxes can no longer reach the model bridge"
    )
    assert fake_cloudflared.spawns() == 1


async def test_sigterm_ignored_escalates_to_sigkill_and_sweeps_the_group(
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
) -> None:
    fake_cloudflared.knobs(IGNORE_SIGTERM="1", GRANDCHILD="1")
    options = make_options(_port(fake_upstream), stop_grace=0.5)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle: TunnelHandle = await nursery.start(run_cloudflared_tunnel, options)
            pgid = handle.pid or 0
            assert len(group_members(pgid)) == 2
            # Cancellation (not stop()) must stop the process just the same.
            nursery.cancel_scope.cancel()
    assert handle.stop_confirmed is True
    assert group_members(pgid) == []
    assert not (run_dir / "tunnel.json").exists()


async def test_dispatch_can_wait_for_the_url_during_a_restart(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
) -> None:
    fake_cloudflared.knobs(CRASH_AFTER_REQUESTS="1,0", URL_DELAY="0,0.5")
    seen: list[Any] = []
    with trio.fail_after(40):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream))
        )
        await _chat(fake_cloudflared, handle.public_url)
        while handle.available:
            await trio.sleep(0.02)
        seen.append(handle.available)
        url = await handle.wait_available()
        assert handle.generation == 2 and url == handle.public_url
        assert (await _chat(fake_cloudflared, url)).status_code == 200
        handle.stop()
        await handle.wait_closed()
    assert seen == [False]


async def test_stop_during_a_restart_leaves_nothing_behind(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
) -> None:
    fake_cloudflared.knobs(CRASH_AFTER_REQUESTS="1,0", URL_DELAY="0,30")
    with trio.fail_after(30):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream))
        )
        await _chat(fake_cloudflared, handle.public_url)
        while fake_cloudflared.spawns() < 2:
            await trio.sleep(0.02)
        assert not handle.available
        handle.stop()
        await handle.wait_closed()
    assert handle.stop_confirmed is True
    assert handle.failure is None
    assert fake_processes(fake_cloudflared.binary) == []
    assert not (run_dir / "tunnel.json").exists()


async def test_without_an_owner_nothing_is_recorded_and_the_process_is_stopped(
    nursery: trio.Nursery,
    fake_upstream: FakeUpstream,
    fake_cloudflared: FakeCloudflared,
    make_options: MakeOptions,
    run_dir: Path,
) -> None:
    with trio.fail_after(30):
        handle: TunnelHandle = await nursery.start(
            run_cloudflared_tunnel, make_options(_port(fake_upstream), owner=None)
        )
        assert os.listdir(run_dir) == []
        assert (await _chat(fake_cloudflared, handle.public_url)).status_code == 200
        pid = handle.pid or 0
        handle.stop()
        await handle.wait_closed()
    assert handle.stop_confirmed is True
    assert not alive(pid)
    assert os.listdir(run_dir) == []
