"""Running the two upload clients against the stand-in: ours (``python -m launcher``) and
osmosis-ai 0.3.8's ``osmosis`` (in the interop environment), each as a subprocess with its own
HOME holding the reference CLI's credentials file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

TOKEN = "osm_pat_0123456789abcdefTOKEN"  # the platform token the stand-in accepts
PROVIDER_KEY = "sk-provider-SECRET-4242424242"  # a provider key in the CLI's environment


def write_credentials(home: Path, platform_url: str, token: str = TOKEN) -> Path:
    """The reference CLI's file store (``~/.config/osmosis/credentials.json``, version 2)."""
    path = home / ".config" / "osmosis" / "credentials.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "access_token": token,
        "token_type": "Bearer",
        "expires_at": "2099-01-01T00:00:00+00:00",
        "created_at": "2026-01-01T00:00:00+00:00",
        "user": {"id": "u1", "email": "dev@example.com", "name": None},
        "token_store": "file",
        "platform_url": platform_url,
    }
    path.write_text(json.dumps({"version": 2, "platforms": {platform_url: entry}}))
    path.chmod(0o600)
    return path


def client_env(home: Path, platform_url: str, **extra: str) -> dict[str, str]:
    """A clean environment: no inherited platform or provider credentials."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OSMOSIS_") and not k.endswith("_API_KEY") and k != "VIRTUAL_ENV"
    }
    env.update(
        HOME=str(home),
        OSMOSIS_PLATFORM_URL=platform_url,
        OPENAI_API_KEY=PROVIDER_KEY,
        COLUMNS="400",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    env.update(extra)
    return env


@dataclass
class Done:
    """A finished client run."""

    returncode: int
    stdout: str
    stderr: str

    def envelope(self) -> dict[str, Any]:
        """The one JSON document on stdout."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, self.stdout + self.stderr
        document: dict[str, Any] = json.loads(lines[0])
        return document


async def run(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], limit_s: float = 60
) -> Done:
    """Run a client to completion under ``fail_after``."""
    with trio.fail_after(limit_s):
        proc = await trio.run_process(
            list(argv),
            cwd=str(cwd),
            env=dict(env),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    return Done(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def ours(*args: str) -> list[str]:
    """``rollbridge <args>``."""
    return [sys.executable, "-m", "launcher", *args]
