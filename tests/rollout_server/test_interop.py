"""osmosis-ai 0.3.8's own RolloutClient drives our server (docs/spec/protocol.md §11, §19).

The reference client runs in a Python 3.12 virtual environment (built once, cached; see
interop_env.py) as a subprocess; our server runs in this test's trio loop on a real port.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import trio

from rollout_server.protocol import RolloutStatus

from .helpers import CANCELLED, start
from .interop_env import NoPython312, interop_python

DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys
    from osmosis_ai.rollout.client import RolloutClient, RolloutProtocolError

    URL = sys.argv[1]
    MSG = [{"role": "user", "content": "hi"}]
    CHAT = "http://127.0.0.1:9/v1/rollouts/x"
    out = {}

    def dump(result):
        return result.model_dump(mode="json")

    async def main():
        client = RolloutClient(url=URL)
        health = await client.health()
        out["health"] = health
        # 1. admission + long-poll to success with reward
        result = await client.run_rollout(
            initial_messages=MSG, chat_completions_url=CHAT, rollout_id="ok1", label="L",
            metadata={"reward": 0.5}, extra_fields={"row_index": 0, "run_index": 0},
        )
        out["success"] = dump(result)
        # 2. failure with a category
        result = await client.run_rollout(
            initial_messages=MSG, chat_completions_url=CHAT, rollout_id="bad1", label="L",
            metadata={"raise": "ValueError"},
        )
        out["failure"] = dump(result)
        # 3. server-side cancel of a running rollout
        handle = await client.run_rollout_async(
            initial_messages=MSG, chat_completions_url=CHAT, rollout_id="can1", label="L",
            metadata={"gate": "interop-never"},
        )
        out["running"] = str(await handle.wait_for_running())
        out["cancel"] = (await client.cancel_rollout("can1")).model_dump(mode="json")
        out["cancelled"] = dump(await handle)
        out["cancel_again"] = (await client.cancel_rollout("can1")).model_dump(mode="json")
        # 4. lease expiry: stop polling locally; the server expires the lease and cancels.
        handle = await client.run_rollout_async(
            initial_messages=MSG, chat_completions_url=CHAT, rollout_id="lease1", label="L",
            metadata={"gate": "interop-never"},
        )
        await handle.wait_for_running()
        handle.cancel()
        idle = await client.wait_idle(timeout_sec=30, poll_interval_sec=0.2)
        out["idle_active"] = idle["lifecycle"]["active_rollouts"]
        # 5. the id is still retained: 409 is fatal for admission
        try:
            await client.run_rollout(
                initial_messages=MSG, chat_completions_url=CHAT, rollout_id="lease1"
            )
        except RolloutProtocolError as exc:
            out["readmit_status"] = exc.status_code
        await client.aclose()

    asyncio.run(main())
    print(json.dumps(out))
    """
)


def _python_or_skip() -> str:
    try:
        return interop_python()
    except NoPython312 as exc:
        print(f"SKIP interop: {exc}")
        pytest.skip(f"interop needs Python 3.12: {exc}")


@pytest.mark.interop
@pytest.mark.slow
async def test_reference_client_drives_our_server(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(240):
        # Building the environment (first run only) is blocking work: keep it off the loop.
        python = await trio.to_thread.run_sync(_python_or_skip)
    with trio.fail_after(90):
        running, client = await start(
            nursery, tmp_path, result_wait_timeout_sec=0.5, polling_lease_timeout_sec=1.5
        )
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER)
        process = await trio.run_process(
            [python, str(driver), running.url],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert process.returncode == 0, process.stderr.decode()[-3000:]
        out = json.loads(process.stdout.decode().strip().splitlines()[-1])

        assert out["health"]["instance_id"] == "test-instance"
        assert out["success"]["status"] == "success"
        assert out["success"]["sample"]["reward"] == 0.5
        assert out["success"]["sample"]["label"] == "L"
        assert (tmp_path / "trials" / "ok1" / "trajectory.json").exists()
        assert out["failure"]["status"] == "failure"
        assert out["failure"]["err_category"] == "validation_error"
        assert out["failure"]["err_message"] == "workflow says no"
        assert out["running"] in ("running", "RolloutStatus.RUNNING")
        assert out["cancel"] == {"dispositions": {"can1": "cancelled_running"}}
        assert out["cancelled"]["status"] == "cancelled"
        assert out["cancelled"]["err_message"] == "cancelled"
        assert out["cancel_again"] == {"dispositions": {"can1": "not_found"}}
        assert out["idle_active"] == 0
        assert out["readmit_status"] == 409
        # The gate never opens: only the lease expiry can have failed and cancelled it.
        assert "lease1" in CANCELLED
        assert running.service.status_of("lease1") == RolloutStatus.FAILURE
        await client.aclose()
        running.force_stop()
