"""Fixtures for the tunnel tests: the fake cloudflared, a run directory, recorded log sinks."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from launcher.process import TunnelOwner
from tests.fakes.cloudflared_support import FakeTunnelTransport, install_fake_cloudflared
from tunnel import TunnelOptions


@dataclass
class Recorder:
    """Collects what the tunnel sends to the run log and to the terminal."""

    lines: list[tuple[str, str, str, Mapping[str, Any] | None]] = field(default_factory=list)
    milestones: list[str] = field(default_factory=list)

    def log(
        self, level: str, step: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        self.lines.append((level, step, message, details))

    def milestone(self, message: str) -> None:
        self.milestones.append(message)

    def messages(self, step: str) -> list[str]:
        return [line[2] for line in self.lines if line[1] == step]


@dataclass
class FakeCloudflared:
    """An installed fake binary, its state directory, and a way to set its knobs."""

    binary: Path
    state: Path
    monkeypatch: pytest.MonkeyPatch

    def knobs(self, **values: str) -> None:
        for name, value in values.items():
            self.monkeypatch.setenv(f"FAKE_CLOUDFLARED_{name}", value)

    def transport(self) -> FakeTunnelTransport:
        return FakeTunnelTransport(self.state)

    def spawns(self) -> int:
        return len(list(self.state.glob("spawn-*")))


@pytest.fixture
def fake_cloudflared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCloudflared:
    state = tmp_path / "fake-state"
    state.mkdir()
    for name in list(os.environ):
        if name.startswith("FAKE_CLOUDFLARED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FAKE_CLOUDFLARED_STATE", str(state))
    return FakeCloudflared(install_fake_cloudflared(tmp_path / "bin"), state, monkeypatch)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_options(
    fake_cloudflared: FakeCloudflared, run_dir: Path, recorder: Recorder
) -> Callable[..., TunnelOptions]:
    """TunnelOptions for the fake, owned by the launcher's :class:`TunnelOwner` (so each process
    is recorded in ``run_dir/tunnel.json``), with timings shortened so tests stay fast."""

    def make(port: int, **overrides: Any) -> TunnelOptions:
        options = TunnelOptions(
            binary=fake_cloudflared.binary,
            local_port=port,
            owner=TunnelOwner(run_dir),
            log=recorder.log,
            milestone=recorder.milestone,
            start_timeout=20.0,
            probe_interval=0.1,
            registration_grace=0.3,
            stop_grace=2.0,
            health_interval=0.2,
            health_failures=2,
            restart_backoff=0.0,
            probe_transport=fake_cloudflared.transport(),
        )
        return dataclasses.replace(options, **overrides)

    return make


def alive(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fake_processes(binary: Path) -> list[psutil.Process]:
    """Live processes running the given fake binary (or started by it)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
        except psutil.Error:
            continue
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(str(binary) in a for a in cmdline):
            found.append(proc)
    return found
