"""Open-file limits through the real CLI (issue 29, item 1): with a low hard limit the run caps
its rollouts in flight to what the limit holds, says so with the numbers, and its rollout
server runs with the raised soft limit; a rollout server that runs out of descriptors anyway
halts the run with that cause, and no row is journaled as failed for it."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.lean_upstream import LeanUpstream, run_lean_upstream
from tests.launcher.e2e.helpers import (
    CLIResult,
    cli_argv,
    fake_model_config,
    run_dir,
    write_config,
)

resource = pytest.importorskip("resource", reason="needs posix resource limits")

pytestmark = pytest.mark.slow

PROBE = """
import os
import resource

from rollout_server import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, serve


def exhaust():
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    finally:
        for fd in held:
            os.close(fd)


class Probe(AgentWorkflow):
    async def run(self, ctx):
        text = ctx.prompt[-1]["content"]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            raise RuntimeError(f"soft open-file limit {soft} was not raised to {hard}")
        if text == "exhaust":
            exhaust()
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": text}])


class Full(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


if __name__ == "__main__":
    serve(LocalBackend(workflow=Probe, grader=Full, max_concurrent=None))
"""


_ARGS = ("eval", "run", "ws/configs/eval/probe.toml")


def _setup(workspace: Path, prompts: list[str]) -> None:
    (workspace / "rollouts" / "echo" / "probe.py").write_text(PROBE)
    lines = [json.dumps({"user_prompt": p, "ground_truth": "g"}) for p in prompts]
    (workspace / "data" / "probe.jsonl").write_text("\n".join(lines) + "\n")
    write_config(
        workspace,
        "probe",
        "[experiment]\n"
        'rollout = "echo"\nentrypoint = "probe.py"\nmodel_path = "rollbridge/echo"\n'
        'dataset = "probe.jsonl"\n\n'
        "[evaluation]\nbatch_size = 2\n\n[secrets]\nrequired = []\n",
    )


async def _run_limited(
    args: list[str], *, cwd: Path, env: dict[str, str], soft: int, hard: int
) -> CLIResult:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with trio.fail_after(180):
        proc = await trio.run_process(
            cli_argv(*args),
            cwd=str(cwd),
            env=dict(env),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
            preexec_fn=preexec,
        )
    return CLIResult(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def _journal(workspace: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir(workspace, name) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _hard_at_least(value: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < value:
        pytest.skip(f"needs an open-file hard limit of at least {value} (have {hard})")


async def test_a_low_hard_limit_caps_in_flight_with_a_notice(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _hard_at_least(512)
    _setup(workspace, ["a", "b", "c", "d", "e", "f"])
    result = await _run_limited(
        [*_ARGS, "--name", "capped", "--yes", "--max-in-flight", "1000"],
        cwd=tmp_path,
        env=env,
        soft=128,
        hard=512,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert (
        "1000 rollouts in flight need about 2128 open files in the rollout server and the bridge "
        in output
    )
    assert "open-file limit of 512 (hard limit 512); running 192 rollouts at a time" in output
    # Every row ran in a rollout server whose soft limit had been raised to the hard one.
    records = _journal(workspace, "capped")
    assert sorted(r["row_index"] for r in records) == list(range(6))
    assert {r["status"] for r in records} == {"success"}, records


async def test_a_rollout_server_out_of_descriptors_halts_the_run(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _hard_at_least(1024)
    _setup(workspace, ["a", "b", "exhaust", "exhaust", "c", "d", "e", "f", "g", "h"])
    result = await _run_limited(
        [*_ARGS, "--name", "emfile", "--yes"],
        cwd=tmp_path,
        env=env,
        soft=1024,
        hard=1024,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "ran out of file descriptors" in output and "Too many open files" in output, output
    records = _journal(workspace, "emfile")
    # The rows that met EMFILE are not journaled (they stay pending for a resume), and no row
    # failed at all: the halt, not the rows, carries the cause.
    assert all(r["status"] == "success" for r in records), records
    assert not {2, 3} & {r["row_index"] for r in records}
    assert len(records) < 10


async def test_the_batched_wait_is_chosen_when_per_rollout_polls_do_not_fit(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """With the bridge in the supervisor's process, a rollout in flight holds three of its
    descriptors with per-rollout long-polls (the poll, the call in, the call out) and two with
    the rollout server's batched wait: at a limit that holds neither for 1000, the run waits
    through the batched wait, says why, and caps at what two per rollout allow."""
    _hard_at_least(512)
    _setup(workspace, ["a", "b", "c", "d", "e", "f"])
    result = await _run_limited(
        [*_ARGS, "--name", "batched", "--yes", "--max-in-flight", "1000"],
        cwd=tmp_path,
        env={**env, "ROLLBRIDGE_BRIDGE_IN_PROCESS": "1"},
        soft=128,
        hard=512,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    logs = (run_dir(workspace, "batched") / "logs.txt").read_text()
    assert "waiting for results through the rollout server's batched wait" in logs, logs
    # (512 - 128 reserved) / 2 per rollout in the supervisor, not / 3.
    assert "1000 rollouts in flight need about 2128 open files in the supervisor " in output
    assert "running 192 rollouts at a time" in output
    records = _journal(workspace, "batched")
    assert sorted(r["row_index"] for r in records) == list(range(6))
    assert {r["status"] for r in records} == {"success"}, records


async def test_the_batched_wait_is_not_chosen_where_it_would_not_fit_more(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """The bridge's own process holds two per rollout either way: per-rollout polls stay."""
    _hard_at_least(512)
    _setup(workspace, ["a", "b"])
    result = await _run_limited(
        [*_ARGS, "--name", "polls", "--yes", "--max-in-flight", "1000"],
        cwd=tmp_path,
        env={k: v for k, v in env.items() if k != "ROLLBRIDGE_BATCHED_WAIT"},
        soft=128,
        hard=512,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    logs = (run_dir(workspace, "polls") / "logs.txt").read_text()
    assert "batched wait" not in logs


async def test_auto_http2_to_an_http1_only_provider_budgets_for_http1(
    workspace: Path, env: dict[str, str], tmp_path: Path, nursery: trio.Nursery
) -> None:
    """``upstream_http2 = "auto"`` (the default) would call the provider over HTTP/2 at this
    in-flight; the provider speaks only HTTP/1.1, so the run says so and budgets the bridge at
    two open files per rollout, rather than let the bridge fall back and run out (here the
    rollout server's capacity caps the in-flight before the budget does)."""
    _hard_at_least(512)
    with trio.fail_after(60):
        lean: LeanUpstream = await nursery.start(partial(run_lean_upstream, h2_streams=0))
    write_config(workspace, "h1only", fake_model_config(batch_size=2))
    args = ["eval", "run", "ws/configs/eval/h1only.toml", "--name", "h1only", "--yes"]
    result = await _run_limited(
        [*args, "--max-in-flight", "1000"],
        cwd=tmp_path,
        env={**env, "OPENAI_BASE_URL": lean.v1, "OPENAI_API_KEY": "sk-fake-h1-key"},
        soft=128,
        hard=512,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"{lean.base_url} does not speak HTTP/2 without TLS (h2c)" in output
    assert "calling the provider over HTTP/2" not in output
    counters = await lean.counters()
    assert counters["h2_refused"] == 1  # the run's question; the bridge itself never asked
    records = _journal(workspace, "h1only")
    # Every row's model call answered (the echo dataset's rows that fail or skip by design
    # do so in grading).
    assert records and all(r["calls"] == 1 for r in records), records
    assert not [r for r in records if r.get("error_type") not in (None, "validation_error")]
