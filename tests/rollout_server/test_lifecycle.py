"""Lease expiry, graceful shutdown and the process entry point, over real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from rollout_server import LocalBackend, RunningServer, create_app
from rollout_server.client import Admission, RolloutClient, ServerShuttingDown
from rollout_server.protocol import LEASE_HEADER, RolloutResultResponse, RolloutStatus

from .helpers import CANCELLED, ScriptedGrader, ScriptedWorkflow, gate, request, start, started

REPO = Path(__file__).resolve().parents[2]


async def parked(running: RunningServer, count: int) -> None:
    """Return once ``count`` long-polls are held on the server (observably, not by a sleep)."""
    while running.service.waiting_polls != count:
        await trio.sleep(0.005)


async def test_lease_expiry_over_http(nursery: trio.Nursery, tmp_path: Path) -> None:
    """The wire form of a lease failure. The timing rule itself (expiry without polls, the
    execution cancelled) is proven in virtual time in test_service.py."""
    with trio.fail_after(20):
        running, client = await start(
            nursery, tmp_path, result_wait_timeout_sec=0.1, polling_lease_timeout_sec=0.3
        )
        admission = await client.admit(request("lx", label="L", metadata={"gate": "lx-never"}))
        while running.service.status_of("lx") != RolloutStatus.FAILURE:
            await trio.sleep(0.05)
        result = await client.poll_once(admission)
        assert (result.status, result.sample, result.err_message, result.err_category) == (
            RolloutStatus.FAILURE,
            None,
            "polling lease expired",
            "lease_expired",
        )
        await client.aclose()
        running.force_stop()


async def test_graceful_shutdown_drains_and_refuses(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(30):
        running, client = await start(
            nursery,
            tmp_path,
            result_wait_timeout_sec=30.0,
            polling_lease_timeout_sec=60.0,
            drain_timeout_sec=0.5,
            cancel_timeout_sec=5.0,
        )
        finishing = await client.admit(request("sd1", label="L", metadata={"gate": "sd1"}))
        stuck = await client.admit(request("sd2", label="L", metadata={"gate": "sd2-never"}))
        await started("sd1").wait()
        await started("sd2").wait()
        results: dict[str, RolloutResultResponse] = {}

        async def wait(name: str, admission: Admission) -> None:
            results[name] = await client.wait_for_result(admission)

        async with trio.open_nursery() as waiters:
            waiters.start_soon(wait, "sd1", finishing)
            waiters.start_soon(wait, "sd2", stuck)
            # Both long-polls are held (30 s hold) before the shutdown starts.
            await parked(running, 2)
            running.request_shutdown()
            while running.service.accepting:
                await trio.sleep(0.01)
            with pytest.raises(ServerShuttingDown) as refused:
                await client.admit(request("late"))
            assert refused.value.status_code == 503
            health = await client.health()
            assert health.accepting_rollouts is False
            # The held polls are still open while the server drains.
            assert running.service.waiting_polls == 2
            gate("sd1").set()
        # sd1 drained to success; sd2 was cancelled after the drain window; the held polls
        # were answered well inside their 30 s hold.
        assert results["sd1"].status == RolloutStatus.SUCCESS
        assert results["sd1"].sample is not None and results["sd1"].sample.reward == 1.0
        assert (results["sd2"].status, results["sd2"].err_message) == (
            RolloutStatus.CANCELLED,
            "cancelled",
        )
        assert "sd2" in CANCELLED and "sd1" not in CANCELLED
        await client.aclose()


async def test_open_long_poll_answers_on_force_stop(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(20):
        running, client = await start(
            nursery, tmp_path, result_wait_timeout_sec=60.0, polling_lease_timeout_sec=120.0
        )
        admission = await client.admit(request("fs", label="L", metadata={"gate": "fs-never"}))
        await started("fs").wait()
        answers: list[httpx.Response] = []

        async def poll() -> None:
            async with httpx.AsyncClient(base_url=running.url, timeout=30) as http:
                answers.append(
                    await http.get("/rollout/fs/result", headers={LEASE_HEADER: admission.token})
                )

        async with trio.open_nursery() as inner:
            inner.start_soon(poll)
            await parked(running, 1)
            running.force_stop()
            # Answered at once, not after the 60 s hold.
            with trio.fail_after(5):
                while not answers:
                    await trio.sleep(0.01)
        # The stop wakes the poll before the cancelled execution finishes, so the answer is
        # the status the rollout had: still running.
        (answer,) = answers
        assert answer.status_code == 200
        assert answer.json() == {
            "rollout_id": "fs",
            "status": "running",
            "sample": None,
            "err_message": None,
            "err_category": None,
        }
        await client.aclose()


async def test_create_app_runs_under_any_asgi_server(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(20):
        app = create_app(
            LocalBackend(ScriptedWorkflow, ScriptedGrader),
            artifact_root=tmp_path,
            result_wait_timeout_sec=5.0,
            polling_lease_timeout_sec=10.0,
        )
        config = Config()
        config.bind = ["127.0.0.1:0"]
        stop = trio.Event()
        binds = await nursery.start(
            partial(hypercorn_serve, app, config, shutdown_trigger=stop.wait)
        )
        async with RolloutClient(binds[0]) as client:
            result = await client.run_rollout(request("asgi", label="L"))
            assert result.status == RolloutStatus.SUCCESS
        assert (tmp_path / "asgi" / "trajectory.json").exists()
        stop.set()


async def test_serve_entrypoint_reads_environment_and_stops_on_sigterm(tmp_path: Path) -> None:
    main = tmp_path / "main.py"
    main.write_text(
        textwrap.dedent(
            """
            from rollout_server import AgentWorkflow, Grader, LocalBackend, serve

            class Echo(AgentWorkflow):
                async def run(self, ctx):
                    return [*ctx.prompt, {"role": "assistant", "content": "ok"}]

            class Exact(Grader):
                async def grade(self, ctx):
                    ctx.set_reward(1.0 if ctx.label == "L" else 0.0)

            if __name__ == "__main__":
                serve(LocalBackend(Echo, Exact))
            """
        )
    )
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "_OSMOSIS_ROLLOUT_PORT": str(port),
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(tmp_path / "trials"),
        "_OSMOSIS_ROLLOUT_INSTANCE_ID": "abc123",
        "PYTHONPATH": str(REPO),
    }
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process = await nursery.start(
                partial(
                    trio.run_process,
                    [sys.executable, str(main)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    check=False,
                )
            )
            url = f"http://127.0.0.1:{port}"
            async with RolloutClient(url) as client:
                while True:
                    try:
                        health = await client.health()
                        break
                    except Exception:
                        await trio.sleep(0.1)
                assert health.instance_id == "abc123"
                assert health.headers["x-osmosis-rollout-instance-id"] == "abc123"
                result = await client.run_rollout(request("env1", label="L"))
                assert result.sample is not None and result.sample.reward == 1.0
            assert (tmp_path / "trials" / "env1" / "trajectory.json").exists()
            process.send_signal(signal.SIGTERM)
        assert process.returncode == 0, process.stderr


async def test_serve_reports_a_busy_port_in_one_line(tmp_path: Path) -> None:
    main = tmp_path / "main.py"
    main.write_text(
        "from rollout_server import LocalBackend, serve\n"
        "from tests.rollout_server.helpers import ScriptedWorkflow\n"
        "serve(LocalBackend(ScriptedWorkflow))\n"
    )
    with trio.socket.socket() as busy:
        await busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with trio.fail_after(60):
            for value, code, message in (
                (str(port), 1, "Address already in use"),
                ("not-a-port", 2, "_OSMOSIS_ROLLOUT_PORT must be a port number"),
            ):
                result = await trio.run_process(
                    [sys.executable, str(main)],
                    env={**os.environ, "_OSMOSIS_ROLLOUT_PORT": value, "PYTHONPATH": str(REPO)},
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                stderr = result.stderr.decode()
                assert result.returncode == code
                assert stderr.startswith("Error: ") and message in stderr
                assert "Traceback" not in stderr
