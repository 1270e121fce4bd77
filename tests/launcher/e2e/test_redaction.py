"""Secrets planted in every place the program writes or prints never come out unredacted:
logs.txt, stdout/stderr (rich, ``--verbose``, ``--json``), error messages, the manifest and
the journal. A configured secret is redacted at any length, with its JSON-escaped and
Python-quoted spellings; an ambient provider key of 8+ characters too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import fake_model_config, run_cli, run_dir, write_config

pytestmark = pytest.mark.slow

TOOL_TOKEN = 'tk"7\\x'  # short, with characters that JSON and repr escape differently
OPENAI_KEY = "sk-planted-openai-key-0123456789"

LEAKY = """
import json
import os

from main import EchoGrader, EchoWorkflow
from rollout_server import LocalBackend, serve

token = os.environ["MY_TOOL_TOKEN"]
key = os.environ["OPENAI_API_KEY"]
print("token:", token, json.dumps(token), repr(token), flush=True)
print("key:", key, json.dumps({"key": key}), flush=True)
if os.environ.get("LEAKY_CRASH"):
    raise SystemExit(f"crash with {token!r} and {key}")
serve(LocalBackend(workflow=EchoWorkflow, grader=EchoGrader))
"""


def _spellings() -> set[str]:
    out = set()
    for value in (TOOL_TOKEN, OPENAI_KEY):
        out |= {value, json.dumps(value)[1:-1], repr(value)[1:-1]}
    return out


def _assert_clean(text: str, where: str) -> None:
    for spelling in _spellings():
        assert spelling not in text, (where, spelling)


def _run_dir_text(run: Path) -> dict[str, str]:
    """Every file the supervisor writes (the rollout's own trial files are out of scope)."""
    skip = {"rollout_trials", "trajectories", "artifacts"}
    return {
        str(p.relative_to(run)): p.read_text(errors="replace")
        for p in run.rglob("*")
        if p.is_file() and not (set(p.relative_to(run).parts) & skip)
    }


async def test_planted_secrets_never_leave_unredacted(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    (workspace / "rollouts" / "echo" / "leaky.py").write_text(LEAKY)
    # The leaky rollout reads the provider key too, so the config must hand it over by name.
    base = fake_model_config(batch_size=2, secrets=["MY_TOOL_TOKEN", "OPENAI_API_KEY"]).replace(
        '"main.py"', '"leaky.py"'
    )
    write_config(workspace, "leaky", base)
    crash = base.replace("[secrets]", '[env]\nLEAKY_CRASH = "1"\n\n[secrets]')
    write_config(workspace, "crash", crash)
    secrets_file = tmp_path / "secrets.env"
    secrets_file.write_text(f"MY_TOOL_TOKEN='{TOOL_TOKEN}'\n")
    run_env = {**env, "OPENAI_BASE_URL": fake_upstream.v1, "OPENAI_API_KEY": OPENAI_KEY}
    common = ["--secrets-file", str(secrets_file), "--yes", "--rows", "0-3"]

    verbose = await run_cli(
        ["eval", "run", "ws/configs/eval/leaky.toml", "--name", "v", "--verbose", *common],
        cwd=tmp_path,
        env=run_env,
    )
    assert verbose.returncode == 0, verbose.stderr + verbose.stdout
    assert "[rollout-server] token: [REDACTED]" in verbose.stdout
    json_run = await run_cli(
        ["eval", "run", "ws/configs/eval/leaky.toml", "--name", "j", "--json", *common],
        cwd=tmp_path,
        env=run_env,
    )
    assert json_run.returncode == 0, json_run.stderr
    assert json_run.envelope()["status"] == "success"
    crashed = await run_cli(
        ["eval", "run", "ws/configs/eval/crash.toml", "--name", "c", *common],
        cwd=tmp_path,
        env=run_env,
    )
    assert crashed.returncode == 1
    assert "Error: rollout server exited with code 1 before becoming healthy: crash with" in (
        crashed.stderr
    )
    assert "[REDACTED]" in crashed.stderr

    for label, result in (("verbose", verbose), ("json", json_run), ("crash", crashed)):
        _assert_clean(result.stdout, f"{label} stdout")
        _assert_clean(result.stderr, f"{label} stderr")
    for name in ("v", "j", "c"):
        files = _run_dir_text(run_dir(workspace, name))
        assert "logs.txt" in files and "manifest.json" in files
        for rel, text in files.items():
            _assert_clean(text, f"{name}/{rel}")
    logs = (run_dir(workspace, "v") / "logs.txt").read_text()
    assert logs.count("[REDACTED]") >= 4
    manifest = json.loads((run_dir(workspace, "v") / "manifest.json").read_text())
    assert manifest["inputs"]["secret_names"] == ["MY_TOOL_TOKEN", "OPENAI_API_KEY"]
