"""terminus-2, Harbor's host-side LLM agent, through the real ``rollbridge eval run``.

The model is :mod:`tests.harbor.scripted_upstream` on 127.0.0.1 (given by ``OPENAI_BASE_URL``);
the bridge stays on loopback, terminus-2 dials it from the host and drives the container's tmux
through ``podman exec``, so no tunnel is involved. Two rows run at once. Checked: reward 1.0 per
row; every row's tokens are the bridge's count of at least two calls under its rollout id (the
scripted usage makes the bridge's figure recognisable); the bridge never forwards the run's
bearer upstream; no retained file, in the run dir or in the backend's scratch dir, holds a byte
of the bearer (read from the live trial process, which is the only place it exists).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import psutil
import pytest
import trio

from tests.harbor.scripted_upstream import USAGE, ScriptedUpstream, run_scripted_upstream
from tests.launcher.e2e.helpers import count_log, journal, run_dir, start_cli, wait_for

pytestmark = pytest.mark.usefixtures("no_containers_left")

PROVIDER_KEY = "sk-scripted-provider-key-0123456789"


def _trial_bearer() -> str | None:
    """The bearer a live trial process got in its environment (``OPENAI_API_KEY``)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if not any(arg.endswith("harbor/_watchdog.py") for arg in cmd):
            continue
        try:
            key = proc.environ().get("OPENAI_API_KEY")
        except psutil.Error:
            continue
        if key and key != PROVIDER_KEY:
            return key
    return None


def _retained_files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


@pytest.mark.timeout(400)
async def test_terminus_2_solves_the_task_on_the_loopback_bridge(
    harbor_workspace: Path, harbor_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "ws/configs/eval/terminus.toml", "--yes", "--name", "t", "--rows", "0-1"]
    run = run_dir(harbor_workspace, "t")
    async with trio.open_nursery() as nursery:
        upstream: ScriptedUpstream = await nursery.start(run_scripted_upstream)
        env = {**harbor_env, "OPENAI_BASE_URL": upstream.v1, "OPENAI_API_KEY": PROVIDER_KEY}
        live = await start_cli(args, cwd=tmp_path, env=env, logdir=tmp_path / "out")
        found: list[str] = []

        def bearer_seen() -> bool:
            key = _trial_bearer()
            if key:
                found.append(key)
            return bool(key) or live.process.returncode is not None

        await wait_for(bearer_seen, timeout=240, interval=0.2)
        result = await live.wait(timeout=300)
        upstream.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert found, "no trial process carried the bridge bearer"
    bearer = found[0]

    records = journal(run)
    assert sorted((r["status"], r.get("reward")) for r in records) == [("success", 1.0)] * 2
    index = [json.loads(line) for line in (run / "index.jsonl").read_text().splitlines()]
    per_call = USAGE["total_tokens"]
    calls = 0
    for row in index:
        # The provider's total (prompt + completion + 1) is kept only by the bridge's ledger.
        assert row["tokens"] % per_call == 0, row
        assert row["tokens"] // per_call >= 2, row
        assert row["max_context_tokens"] == USAGE["prompt_tokens"] + USAGE["completion_tokens"]
        calls += row["tokens"] // per_call
    assert {r["rollout_id"]: r["tokens"] for r in records} == {
        r["rollout_id"]: r["tokens"] for r in index
    }
    assert calls == upstream.agent_calls
    # The record (docs/calls.md): one call record per call the provider answered, summing to
    # the rows' tokens and metrics.json; terminus-2's turns are in each row's trajectory.
    recorded = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines()]
    rollout_calls = [c for c in recorded if c["kind"] == "rollout"]
    assert len(rollout_calls) == upstream.agent_calls
    summary = json.loads((run / "metrics.json").read_text())["summary"]
    assert summary["calls"] == upstream.agent_calls
    for row in index:
        mine = [c for c in rollout_calls if c["rollout_id"] == row["rollout_id"]]
        assert row["calls"] == len(mine)
        assert row["tokens"] == sum(c["total_tokens"] for c in mine)
        trial = run / "rollout_trials" / row["rollout_id"]
        steps = json.loads((trial / "trajectory.json").read_text())["steps"]
        assert sum(1 for step in steps if step["source"] == "agent") >= 2, steps
    assert upstream.authorizations
    assert all(auth == f"Bearer {PROVIDER_KEY}" for auth in upstream.authorizations)

    # terminus-2 is host-side: the loopback bridge served it, no tunnel was planned or started.
    assert count_log(run, "[tunnel]") == 0
    assert "tunnel" not in result.stdout.lower()

    scratch = Path(tempfile.gettempdir()) / f"rollbridge-harbor-{os.getuid()}"
    mine = [scratch / "trials" / f"trial-{r['rollout_id']}" for r in records]
    files = _retained_files(run, *mine)
    assert any(p.parts[-2:] == ("agent", "trajectory.json") for p in files)
    for path in files:
        assert bearer.encode() not in path.read_bytes(), path
    for text in (result.stdout, result.stderr):
        assert bearer not in text
