"""Locating cloudflared: explicit path, PATH, pycloudflared's cache, opt-in download only."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pycloudflared.util
import pytest

from tunnel import CloudflaredNotFound, locate_cloudflared


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH without any cloudflared, and a pycloudflared cache location that is empty."""
    bindir = tmp_path / "path-bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    cache = tmp_path / "site-packages" / "cloudflared-linux-amd64"
    monkeypatch.setattr(
        pycloudflared.util, "get_info", lambda: SimpleNamespace(executable=str(cache))
    )

    def no_download(info: object = None) -> str:
        raise AssertionError("downloaded without the user's consent")

    monkeypatch.setattr(pycloudflared.util, "download", no_download)
    return bindir


def test_explicit_path_wins(tmp_path: Path, empty_path: Path) -> None:
    _executable(empty_path / "cloudflared")
    explicit = _executable(tmp_path / "mine" / "cloudflared")
    assert locate_cloudflared(explicit, allow_download=False) == explicit.resolve()


def test_explicit_path_must_be_executable(tmp_path: Path, empty_path: Path) -> None:
    plain = tmp_path / "cloudflared"
    plain.write_text("not executable")
    for bad in (plain, tmp_path / "missing", tmp_path):
        with pytest.raises(CloudflaredNotFound) as info:
            locate_cloudflared(bad, allow_download=True)
        assert str(info.value).startswith(f"--cloudflared {bad} is not an executable file.")


def test_path_is_searched(empty_path: Path) -> None:
    binary = _executable(empty_path / "cloudflared")
    assert locate_cloudflared(None, allow_download=False) == binary.resolve()


def test_pycloudflared_cache_is_used_without_download(tmp_path: Path, empty_path: Path) -> None:
    cached = _executable(tmp_path / "site-packages" / "cloudflared-linux-amd64")
    assert locate_cloudflared(None, allow_download=False) == cached.resolve()


def test_missing_binary_names_every_option(empty_path: Path) -> None:
    with pytest.raises(CloudflaredNotFound) as info:
        locate_cloudflared(None, allow_download=False)
    message = str(info.value)
    assert message.startswith(
        "This rollout needs a public chat endpoint, but the `cloudflared` binary is not on PATH"
    )
    for option in (
        "brew install cloudflared",
        "--cloudflared PATH",
        "--download-cloudflared",
        "--advertise-url",
    ):
        assert option in message
    assert "\n" not in message


def test_download_only_when_allowed(
    tmp_path: Path, empty_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "site-packages" / "cloudflared-linux-amd64"
    calls: list[object] = []

    def fake_download(info: object = None) -> str:
        calls.append(info)
        return str(_executable(target))

    monkeypatch.setattr(pycloudflared.util, "download", fake_download)
    with pytest.raises(CloudflaredNotFound):
        locate_cloudflared(None, allow_download=False)
    assert calls == []
    assert locate_cloudflared(None, allow_download=True) == target.resolve()
    assert len(calls) == 1


def test_failed_download_is_one_clear_line(
    empty_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(info: object = None) -> str:
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(pycloudflared.util, "download", offline)
    with pytest.raises(CloudflaredNotFound) as info:
        locate_cloudflared(None, allow_download=True)
    message = str(info.value)
    assert message.startswith("could not download cloudflared through pycloudflared: OSError:")
    assert "--advertise-url" in message
