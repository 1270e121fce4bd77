"""A resume against another upstream (another ``OPENAI_BASE_URL``) is refused through the real
CLI with ``Changed: model`` (issue 13, item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.fakes.upstream import FakeUpstream, run_fake_upstream
from tests.launcher.e2e.helpers import fake_model_config, run_cli, run_dir, write_config

pytestmark = pytest.mark.slow


async def test_resume_against_another_upstream_is_refused(
    workspace: Path, env: dict[str, str], tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    write_config(workspace, "fake", fake_model_config(batch_size=1))
    args = [
        "eval",
        "run",
        "ws/configs/eval/fake.toml",
        "--name",
        "locked",
        "--rows",
        "0-1",
        "--yes",
    ]
    key = {"OPENAI_API_KEY": "sk-fake-lock-key-0000"}
    first = await run_cli(
        args, cwd=tmp_path, env={**env, **key, "OPENAI_BASE_URL": fake_upstream.v1}
    )
    assert first.returncode == 0, first.stderr + first.stdout
    async with trio.open_nursery() as nursery:
        other: FakeUpstream = await nursery.start(run_fake_upstream)
        second = await run_cli(args, cwd=tmp_path, env={**env, **key, "OPENAI_BASE_URL": other.v1})
        nursery.cancel_scope.cancel()
    assert second.returncode == 1
    assert "Changed: model." in second.stderr
    assert other.requests == []  # refused before anything was sent
    manifest = (run_dir(workspace, "locked") / "manifest.json").read_text()
    assert fake_upstream.v1 in manifest and "sk-fake-lock-key" not in manifest
