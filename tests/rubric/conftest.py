"""Fixtures: a fake judge on a real loopback port, the environment pointing ``openai/…`` at
it, and a way to run the real CLI entry point (in a worker thread, since it runs its own trio
loop) while the fake serves on the test's loop."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from launcher.cli import main
from tests.fakes.upstream import run_fake_upstream
from tests.rubric.fake_judge import FakeJudge

API_KEY = "sk-rubric-test-key-0123456789"


@dataclass
class Outcome:
    """A finished CLI invocation."""

    code: int
    out: str
    err: str

    def envelope(self) -> dict[str, Any]:
        """The one JSON document on stdout (``--json``)."""
        lines = [line for line in self.out.splitlines() if line.strip()]
        assert len(lines) == 1, self.out
        document: dict[str, Any] = json.loads(lines[0])
        return document


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    """Run ``rollbridge <args>`` in this thread and capture what it printed."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return Outcome(int(exc.value.code or 0), out, err)


@pytest.fixture
async def judge(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeJudge]:
    """A fake judge, with ``openai/<name>`` routed to it."""
    fake: FakeJudge = await nursery.start(run_fake_upstream, FakeJudge())
    monkeypatch.setenv("OPENAI_BASE_URL", fake.v1)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    yield fake
    fake.stop()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """``await cli(*args)``: the CLI run in a worker thread, under ``fail_after``."""

    async def run(*args: str, timeout: float = 60.0) -> Outcome:
        with trio.fail_after(timeout):
            return await trio.to_thread.run_sync(lambda: invoke(capsys, *args))

    return run


def write_jsonl(path: Path, *objects: Any) -> Path:
    """Write one JSON value per line."""
    path.write_text("".join(json.dumps(o) + "\n" for o in objects), encoding="utf-8")
    return path


def conversation(answer: str, **extra: Any) -> dict[str, Any]:
    """A record whose last assistant message is ``answer``."""
    return {
        "messages": [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": answer},
        ],
        **extra,
    }
