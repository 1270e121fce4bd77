"""The rollout server's environment: no provider credentials or settings unless the eval config
names them (item 3 of issue 12)."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.rollout_child import ServerLaunch, _child_env, is_provider_env_name
from rollout_server.protocol import ENV_PORT

AMBIENT = {
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "OPENAI_API_KEY": "sk-a",
    "OPENAI_BASE_URL": "http://x/v1",
    "OPENAI_ORGANIZATION": "org-1",
    "ANTHROPIC_API_BASE": "http://x",
    "AZURE_API_VERSION": "2024-01-01",
    "FAL_AI_API_BASE": "http://fal",
    "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "AWS_PROFILE": "prod",
    "GITHUB_TOKEN": "ghp",
    "DB_PASSWORD": "pw",
    "VIRTUAL_ENV": "/venv",
}


def test_provider_names() -> None:
    kept = {n for n in AMBIENT if not is_provider_env_name(n)}
    assert kept == {"PATH", "HOME", "LANG", "VIRTUAL_ENV"}


def test_child_env_drops_ambient_credentials_but_keeps_what_the_config_names(
    tmp_path: Path,
) -> None:
    launch = ServerLaunch(
        python=Path("/venv/bin/python"),
        entrypoint=tmp_path / "main.py",
        rollout_dir=tmp_path,
        run_dir=tmp_path,
        base_env=AMBIENT,
        config_env={"OPENAI_BASE_URL": "http://config/v1"},
        secrets={"GITHUB_TOKEN": "ghp-resolved"},
    )
    env = _child_env(launch, 4242, "iid", "server-token-0123456789")
    assert set(env) - {"PYTHONUNBUFFERED"} == {
        "PATH",
        "HOME",
        "LANG",
        "OPENAI_BASE_URL",
        "GITHUB_TOKEN",
        ENV_PORT,
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT",
        "_OSMOSIS_ROLLOUT_INSTANCE_ID",
        "_ROLLBRIDGE_ROLLOUT_SERVER_TOKEN",
        "_ROLLBRIDGE_SUPERVISOR_PID",
    }
    assert env["_ROLLBRIDGE_SUPERVISOR_PID"] == str(os.getpid())
    assert env["_ROLLBRIDGE_ROLLOUT_SERVER_TOKEN"] == "server-token-0123456789"
    assert env["OPENAI_BASE_URL"] == "http://config/v1" and env["GITHUB_TOKEN"] == "ghp-resolved"


def test_the_health_check_is_woken_by_the_line_naming_the_port() -> None:
    import trio

    from launcher.rollout_child import _announcing

    lines: list[str] = []
    announced = trio.Event()
    sink = _announcing(lines.append, 43117, announced)
    sink("importing main.py")
    sink("listening on :4311")  # not this port
    assert not announced.is_set()
    sink("rollout server listening on http://127.0.0.1:43117")
    assert announced.is_set()
    assert lines[-1].endswith(":43117") and len(lines) == 3  # every line still reaches the log
