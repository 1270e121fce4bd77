"""What can be checked in milliseconds is checked before ``uv sync``: with a rollout whose
``pyproject.toml`` uv cannot read, a missing model key and an advertise URL that does not
resolve are what the run reports, not the sync's failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launcher.e2e.helpers import fake_model_config, run_cli, write_config

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], "Error: model preflight failed for 'openai/fake-model': AuthenticationError: "),
        (
            ["--advertise-url", "http://no-such-host.invalid:9/", "--listener-port", "39411"],
            "Error: --advertise-url http://no-such-host.invalid:9/: its host",
        ),
    ],
)
async def test_cheap_checks_come_before_the_sync(
    workspace: Path, env: dict[str, str], tmp_path: Path, flags: list[str], expected: str
) -> None:
    (workspace / "rollouts" / "echo" / "pyproject.toml").write_text("[project\n")
    write_config(workspace, "keyless", fake_model_config())
    run_env = dict(env)
    if flags:
        run_env["OPENAI_API_KEY"] = "sk-present-0123456789"
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/keyless.toml", "--yes", *flags],
        cwd=tmp_path,
        env=run_env,
    )
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    assert "uv sync failed" not in result.stderr
