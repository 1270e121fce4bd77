"""Failures that explain themselves, through the real CLI: the reason of a failed row in the
terminal, ``logs.txt``, the journal, ``index.jsonl`` and ``--json``; a row that cannot be sent
fails alone (and again on a retry) without halting; the rollout server inherits no provider
credentials; a non-ASCII provider key stops the run at the preflight."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import journal, run_cli, run_dir, write_config

pytestmark = pytest.mark.slow

# A rollout in the example's environment (same dependencies, so the shared env serves it): it
# writes the names of its environment where [env] says, fails rows whose prompt says
# "explode <text>" with ValueError(<text>) and "leak <NAME>" with the value of $NAME in the
# message, and echoes the others (reward 1).
PROBE = """
import json
import os
import time
import urllib.error
import urllib.request

import trio
from pathlib import Path

from rollout_server import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, serve
from rollout_server import get_rollout_context


async def _post(url, body, headers):  # its status; sent from a thread: the server is this loop
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")

    def send():
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code

    return await trio.to_thread.run_sync(send)


class Probe(AgentWorkflow):
    async def run(self, ctx):
        out = os.environ.get("PROBE_ENV_OUT")
        if out:
            Path(out).write_text(json.dumps(sorted(os.environ)))
        text = ctx.prompt[-1]["content"]
        if text.startswith("explode-from "):  # the reason read from a file at each run
            _, path, tag = text.split(" ")
            mode = Path(path).read_text().strip()
            raise ValueError(mode if mode == "same" else f"{mode} {tag}")
        if text == "cancel everything":  # as a sandbox reaching the host's loopback could
            port = os.environ["_OSMOSIS_ROLLOUT_PORT"]
            tokens = [k for k in os.environ if "ROLLOUT_SERVER_TOKEN" in k]
            code = await _post(f"http://127.0.0.1:{port}/rollout/cancel", b'{"all": true}', {})
            raise ValueError(f"cancel answered {code}; token variables seen: {tokens}")
        if text == "spend elsewhere":  # a call under an id the supervisor never issued
            rollout = get_rollout_context()
            base = rollout.chat_completions_url.rsplit("/", 1)[0]
            body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
            own = rollout.chat_completions_url + "/chat/completions"
            made_up = base + "/made-up-id/chat/completions"
            codes = []
            for url, key in ((own, rollout.api_key), (made_up, rollout.api_key), (made_up, "x")):
                headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
                codes.append(await _post(url, body, headers))
            raise ValueError(f"made-up id answered {codes}")
        if text.startswith("block "):  # blocks the server's event loop, as a sync call would
            time.sleep(float(text.removeprefix("block ")))
        if text.startswith("explode "):
            raise ValueError(text.removeprefix("explode "))
        if text.startswith("leak "):
            raise RuntimeError("token=" + os.environ[text.removeprefix("leak ")])
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": text}])


class Full(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


if __name__ == "__main__":
    serve(LocalBackend(workflow=Probe, grader=Full))
"""


def _config(*, env: dict[str, str] | None = None, secret_names: tuple[str, ...] = ()) -> str:
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in (env or {}).items())
    return (
        "[experiment]\n"
        'rollout = "echo"\nentrypoint = "probe.py"\nmodel_path = "rollbridge/echo"\n'
        'dataset = "probe.jsonl"\n\n'
        "[evaluation]\nbatch_size = 2\nagent_workflow_timeout_s = 60\ngrader_timeout_s = 30\n\n"
        + (f"[env]\n{env_lines}\n" if env_lines else "")
        + "[secrets]\nrequired = ["
        + ", ".join(f'"{s}"' for s in secret_names)
        + "]\n"
    )


def _probe_workspace(workspace: Path, prompts: list[str]) -> None:
    (workspace / "rollouts" / "echo" / "probe.py").write_text(PROBE)
    lines = [
        json.dumps({"system_prompt": "s", "user_prompt": p, "ground_truth": "g"}) for p in prompts
    ]
    (workspace / "data" / "probe.jsonl").write_text("\n".join(lines) + "\n")


async def test_a_workflow_exception_is_shown_and_kept_everywhere(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    nonce = f"nonce-{secrets.token_hex(8)}"
    # json.dumps writes the lone surrogate as the escape \udc80: valid JSON, invalid Unicode.
    _probe_workspace(workspace, ["hello", f"explode {nonce}", "bad \udc80 text", "bye"])
    write_config(workspace, "probe", _config())
    args = ["eval", "run", "ws/configs/eval/probe.toml", "--name", "why", "--yes"]
    result = await run_cli(args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    out = result.stdout
    # The terminal: the failed-row line, then its reason.
    assert "row 1 run 0: error_type=validation_error -> ws/.osmosis/evals/why/" in out
    assert f"  agent: ValueError: {nonce}" in out
    # The unsendable row failed alone, with its reason; the others ran.
    assert "row 2 run 0: error_type=rollout_protocol_error" in out
    assert "admission: UnsendableRequest: initial_messages[1].content holds text" in out
    assert "stopping dispatch" not in out

    run = run_dir(workspace, "why")
    by_row = {r["row_index"]: r for r in journal(run)}
    assert [by_row[i]["status"] for i in range(4)] == ["success", "failed", "failed", "success"]
    assert by_row[1]["error_type"] == "validation_error"
    assert by_row[1]["error"] == {"phase": "agent", "type": "ValueError", "message": nonce}
    assert by_row[2]["error"]["phase"] == "admission"
    assert "error" not in by_row[0]
    index = {
        r["row_index"]: r
        for r in map(json.loads, (run / "index.jsonl").read_text().split("\n")[:-1])
    }
    assert index[1]["error"] == by_row[1]["error"]
    failed_lines = [
        line for line in (run / "logs.txt").read_text().splitlines() if "work item failed" in line
    ]
    assert any(nonce in line and '"row_index":1' in line for line in failed_lines)

    # --retry-failed runs both failed rows again: they fail the same way, nothing halts.
    again = await run_cli([*args, "--retry-failed", "--json"], cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr + again.stdout
    resource = again.envelope()["result"]
    assert resource["dispatched"] == 2 and resource["failed"] == 2
    rows = {r["row_index"]: r for r in resource["failed_rows"]}
    assert rows[1]["error"] == {"phase": "agent", "type": "ValueError", "message": nonce}
    assert rows[1]["status"] == "failed"
    assert rows[2]["error"]["type"] == "UnsendableRequest"


async def test_the_rollout_server_inherits_no_provider_credentials(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _probe_workspace(workspace, ["hello", "leak ROLLOUT_ONLY_TOKEN"])
    names_file = tmp_path / "names.json"
    write_config(
        workspace,
        "probe",
        _config(env={"PROBE_ENV_OUT": str(names_file)}, secret_names=("ROLLOUT_ONLY_TOKEN",)),
    )
    ambient = {
        "OPENAI_API_KEY": "sk-ambient-openai-0123456789",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "ANTHROPIC_API_KEY": "sk-ant-ambient-0123456789",
        "OPENROUTER_API_BASE": "http://127.0.0.1:9/api",
        "GITHUB_TOKEN": "ghp_ambient0123456789",
        "AWS_SECRET_ACCESS_KEY": "aws-ambient-0123456789",
        "ROLLOUT_ONLY_TOKEN": "asked-for-by-name-0123",
    }
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/probe.toml", "--name", "env", "--yes"],
        cwd=tmp_path,
        env={**env, **ambient},
    )
    assert result.returncode == 0, result.stderr + result.stdout
    names = set(json.loads(names_file.read_text()))
    leaked = {"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "OPENROUTER_API_BASE"}
    leaked |= {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"}
    assert not (names & leaked), names & leaked
    # What the config names still arrives, and so does the ordinary environment.
    assert {"ROLLOUT_ONLY_TOKEN", "PROBE_ENV_OUT", "PATH", "HOME"} <= names
    # A secret in a failure's message is redacted wherever the reason is kept or shown.
    run = run_dir(workspace, "env")
    failed = [r for r in journal(run) if r["status"] == "failed"]
    assert failed[0]["error"]["message"] == "token=[REDACTED]"
    assert "agent: RuntimeError: token=[REDACTED]" in result.stdout
    secret = ambient["ROLLOUT_ONLY_TOKEN"]
    for text in (result.stdout, result.stderr, (run / "logs.txt").read_text()):
        assert secret not in text
    assert secret not in (run / "events.jsonl").read_text() + (run / "index.jsonl").read_text()


async def test_a_non_ascii_provider_key_stops_the_run(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _probe_workspace(workspace, ["hello"])
    config = _config().replace('"rollbridge/echo"', '"openai/fake-model"')
    write_config(workspace, "probe", config)
    key = "sk-\u201cpasted-0123456789\u201d"
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/probe.toml", "--name", "key", "--yes"],
        cwd=tmp_path,
        env={**env, "OPENAI_API_KEY": key, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: model preflight failed for 'openai/fake-model': ")
    assert "OPENAI_API_KEY contains non-ASCII characters" in lines[0]
    assert "pasted-0123456789" not in result.stderr + result.stdout
    assert journal(run_dir(workspace, "key")) == []


@pytest.mark.parametrize(("rows", "complete"), [(5, True), (9, False)])
async def test_a_halt_that_cut_nothing_short_leaves_the_run_complete(
    workspace: Path, env: dict[str, str], tmp_path: Path, rows: int, complete: bool
) -> None:
    """Every row fails the same way, so the same-failure halt fires at the fifth. With five
    rows every item then has its result: the run is complete (exit 0, ``finished``); with
    nine, the rest stay pending (exit 1, ``incomplete``)."""
    _probe_workspace(workspace, ["explode same"] * rows)
    write_config(workspace, "probe", _config().replace("batch_size = 2", "batch_size = 1"))
    name = f"halt{rows}"
    args = ["eval", "run", "ws/configs/eval/probe.toml", "--name", name, "--yes"]
    result = await run_cli(args, cwd=tmp_path, env=env)
    out = result.stdout
    assert "stopping dispatch: all recent rows failed the same way" in out, out
    run = run_dir(workspace, name)
    status = json.loads((run / "metrics.json").read_text())["eval_run"]["status"]
    if complete:
        assert result.returncode == 0, result.stderr + out
        assert status == "finished" and "Evaluation run finished" in out
        assert "Results (incomplete)" not in out and len(journal(run)) == 5
    else:
        assert result.returncode == 1, result.stderr + out
        assert status == "incomplete" and "Results (incomplete)" in out
        assert len(journal(run)) < rows


async def test_a_retry_halted_half_way_is_not_reported_as_finished(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """Nine rows fail, each its own way (no halt). Their --retry-failed fails them all the same
    way, so it halts at the fifth: the four left keep their old failures, which make every item
    look answered, but the retry did not run them: exit 1, not "finished"."""
    mode = tmp_path / "mode.txt"
    mode.write_text("differs")
    _probe_workspace(workspace, [f"explode-from {mode} {i}" for i in range(9)])
    write_config(workspace, "probe", _config().replace("batch_size = 2", "batch_size = 1"))
    args = ["eval", "run", "ws/configs/eval/probe.toml", "--name", "rh", "--yes"]
    first = await run_cli(args, cwd=tmp_path, env=env)
    assert first.returncode == 0 and "stopping dispatch" not in first.stdout, first.stdout
    mode.write_text("same")
    retry = await run_cli([*args, "--retry-failed"], cwd=tmp_path, env=env)
    out = retry.stdout
    assert "stopping dispatch: all recent rows failed the same way" in out, out
    assert retry.returncode == 1, retry.stderr + out
    assert "Evaluation run finished" not in out
    assert "Evaluation run interrupted" in out  # the partial result's words (spec 10.6)
    assert "Results (incomplete)" in out
    run = run_dir(workspace, "rh")
    assert json.loads((run / "metrics.json").read_text())["eval_run"]["status"] == "incomplete"


@pytest.mark.parametrize("mode", ["--plain", "--json"])
async def test_plain_and_json_say_why_dispatch_halted(
    workspace: Path, env: dict[str, str], tmp_path: Path, mode: str
) -> None:
    """Without the rich view's notes, the halt's reason still reaches the user: a warning on
    stderr, and in --json the result's ``halted``."""
    _probe_workspace(workspace, ["explode same"] * 9)
    write_config(workspace, "probe", _config().replace("batch_size = 2", "batch_size = 1"))
    args = ["eval", "run", "ws/configs/eval/probe.toml", "--name", "hp", "--yes", mode]
    result = await run_cli(args, cwd=tmp_path, env=env)
    assert result.returncode == 1, result.stderr + result.stdout
    reason = "all recent rows failed the same way: agent: ValueError: same"
    assert f"stopping dispatch: {reason}" in result.stderr, result.stderr
    if mode == "--json":
        envelope = json.loads(result.stdout.strip().splitlines()[-1])
        assert envelope["status"] == "partial"
        assert envelope["result"]["halted"].startswith(reason)


async def test_a_workflow_that_blocks_the_server_does_not_hold_the_run(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """A workflow that blocks the rollout server's event loop (a sync sleep) makes it answer
    nothing: dispatch halts, and then neither the cancels' settle bound (120 s) nor the long
    stop grace (330 s, for a server draining its rollouts) is waited out for a server that
    cannot answer. The bound below is a hang guard (the halt comes at about 31 s, the
    admission's read timeout): the run took 7.5 minutes before."""
    _probe_workspace(workspace, ["block 900"] * 3)
    config = _config().replace("agent_workflow_timeout_s = 60", "agent_workflow_timeout_s = 5")
    write_config(workspace, "probe", config)
    args = ["eval", "run", "ws/configs/eval/probe.toml", "--name", "blk", "--yes", "--plain"]
    result = await run_cli(args, cwd=tmp_path, env=env, timeout=150)
    assert result.returncode == 1, result.stderr + result.stdout
    # Which request finds the server deaf first (an admission, or a result wait) is a race.
    assert "stopping dispatch: the rollout server does not answer (" in result.stderr, result.stderr
    assert journal(run_dir(workspace, "blk")) == []  # nothing recorded: every row stays pending


async def _probe_then_hello(
    workspace: Path, env: dict[str, str], tmp_path: Path, prompt: str, name: str
) -> dict[int, dict[str, object]]:
    """Run the probe rollout on ``prompt`` then on "hello" (which must succeed): the journal's
    records by row."""
    _probe_workspace(workspace, [prompt, "hello"])
    write_config(workspace, "probe", _config())
    args = ["eval", "run", "ws/configs/eval/probe.toml", "--name", name, "--yes"]
    result = await run_cli(args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    records = {r["row_index"]: r for r in journal(run_dir(workspace, name))}
    assert records[1]["status"] == "success"
    return records


async def test_the_rollout_server_takes_no_order_without_the_supervisor_s_token(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """A sandbox reaching the host's loopback (slirp) finds the rollout server there: without
    the bearer the supervisor gave it, a cancel of every rollout is refused (401), and the
    workflow's environment does not hold that bearer."""
    records = await _probe_then_hello(workspace, env, tmp_path, "cancel everything", "tok")
    assert "cancel answered 401; token variables seen: []" in json.dumps(records[0]), records[0]


async def test_no_call_is_served_under_a_rollout_id_the_supervisor_did_not_issue(
    workspace: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """Each rollout gets a bearer of its own (bridge.bearers): with it, a call under a made-up
    id (spend the run would not record, under an id no revocation covers) is a 401."""
    records = await _probe_then_hello(workspace, env, tmp_path, "spend elsewhere", "mid")
    # Its own call is served; under a made-up id, neither its bearer nor another is.
    assert "made-up id answered [200, 401, 401]" in json.dumps(records[0]), records[0]
