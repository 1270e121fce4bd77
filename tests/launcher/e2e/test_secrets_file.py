"""``--secrets-file`` holds provider keys for the bridge: read whether or not ``[secrets]`` lists
them, winning over the environment, parsed as python-dotenv parses (inline comments), and never
handed to the rollout unless the config lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream
from tests.launcher.e2e.helpers import fake_model_config, run_cli, write_config

pytestmark = pytest.mark.slow

FILE_KEY = "sk-from-the-secrets-file-0123"
ENV_KEY = "sk-from-the-environment-4567"

PROBE = """
import os
from pathlib import Path

from main import EchoGrader, EchoWorkflow
from rollout_server import LocalBackend, serve

Path(os.environ["REPORT_FILE"]).write_text(repr(os.environ.get("OPENAI_API_KEY")))
serve(LocalBackend(workflow=EchoWorkflow, grader=EchoGrader))
"""


async def test_a_provider_key_in_the_secrets_file_reaches_the_bridge_only(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    (workspace / "rollouts" / "echo" / "probe.py").write_text(PROBE)
    report = tmp_path / "rollout-saw.txt"
    config = fake_model_config(batch_size=2, extra_env={"REPORT_FILE": str(report)})
    write_config(workspace, "probe", config.replace('"main.py"', '"probe.py"'))
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f"OPENAI_API_KEY={FILE_KEY}  # staging key\n")
    run_env = {**env, "OPENAI_BASE_URL": fake_upstream.v1, "OPENAI_API_KEY": ENV_KEY}

    result = await run_cli(
        ["eval", "run", "ws/configs/eval/probe.toml", "--secrets-file", str(secrets), "--yes"],
        cwd=tmp_path,
        env=run_env,
    )

    assert result.returncode == 0, result.stderr + result.stdout
    keys = {r.headers.get("authorization") for r in fake_upstream.requests if r.method == "POST"}
    assert keys == {f"Bearer {FILE_KEY}"}
    assert report.read_text() == "None"
    assert FILE_KEY not in result.stdout + result.stderr
