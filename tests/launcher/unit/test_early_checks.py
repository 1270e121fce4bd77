"""The cheap checks made before ``uv sync`` (launcher.early_checks): a model's missing or
non-ASCII key, a managed tunnel without cloudflared, an advertise URL whose host does not
resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from launcher.early_checks import check_advertise_host, check_cloudflared, check_model_key
from launcher.errors import CLIError


def _same(text: str) -> str:
    return text


def test_a_direct_model_without_its_key_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(CLIError) as info:
        check_model_key("openai/gpt-x", _same)
    assert info.value.message == (
        "model preflight failed for 'openai/gpt-x': AuthenticationError: OPENAI_API_KEY is not "
        "set; export it or put it in --secrets-file to use 'openai/gpt-x'"
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-\u201ckey")
    with pytest.raises(CLIError, match="OPENAI_API_KEY contains non-ASCII characters"):
        check_model_key("openai/gpt-x", _same)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-key")
    check_model_key("openai/gpt-x", _same)
    check_model_key("rollbridge/echo", _same)


def test_a_managed_tunnel_needs_cloudflared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("tunnel.locate._pycloudflared_cached", lambda: None)
    with pytest.raises(CLIError, match="the `cloudflared` binary is not on PATH"):
        check_cloudflared(True, None, False)
    with pytest.raises(CLIError, match="is not an executable file"):
        check_cloudflared(False, str(tmp_path / "nope"), False)
    check_cloudflared(False, None, False)  # no tunnel asked for: nothing to check
    check_cloudflared(True, None, True)  # a download is allowed: the tunnel step does it


async def test_an_advertise_host_that_does_not_resolve_fails() -> None:
    with trio.fail_after(30):
        with pytest.raises(CLIError, match=r"its host no-such-host\.invalid does not resolve"):
            await check_advertise_host("http://no-such-host.invalid:9/")
        with pytest.raises(CLIError, match="has no host"):
            await check_advertise_host("http:///x")
        await check_advertise_host("http://127.0.0.1:9/")
        # Only a container resolves its engine's host alias; the sandbox probe judges it.
        await check_advertise_host("http://host.containers.internal:9/")
        await check_advertise_host(None)
