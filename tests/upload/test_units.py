"""Identity resolution, presigned-PUT instruction checks, progress text and the ``eval run
--upload`` step's message, as plain functions."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import pytest
import trio

from launcher.errors import CLIError
from launcher.ui import UI
from launcher.upload.command import AfterRunUpload, resolve_upload_dir, retry_command
from launcher.upload.identity import (
    AuthError,
    PlatformIdentity,
    git_identity,
    normalize_platform_url,
    resolve_identity,
)
from launcher.upload.progress import UploadProgress
from launcher.upload.put import PutError, UploadInfo, _parts
from tests.upload.helpers import write_credentials


def _repo(path: Path, origin: str) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "remote", "add", "origin", origin], check=True)
    return path


@pytest.mark.parametrize(
    ("origin", "identity"),
    [
        ("https://github.com/Acme/Rollouts.git", "acme/rollouts"),
        ("git@github.com:Acme/Rollouts.git", "acme/rollouts"),
        ("https://user:pw@github.com/acme/r", "acme/r"),
        ("https://gitlab.com/acme/r.git", None),
        ("https://github.com/acme/r/extra", None),
    ],
)
def test_git_identity(tmp_path: Path, origin: str, identity: str | None) -> None:
    found, display = git_identity(_repo(tmp_path, origin))
    assert found == identity
    assert display is None or "pw" not in display


def test_platform_url_normalization() -> None:
    assert normalize_platform_url(None) == "https://platform.osmosis.ai"
    assert (
        normalize_platform_url("HTTPS://Platform.Osmosis.AI:443/") == "https://platform.osmosis.ai"
    )
    assert normalize_platform_url("localhost:3000") == "http://localhost:3000"


def test_token_sources(tmp_path: Path) -> None:
    ws = _repo(tmp_path / "ws", "https://github.com/acme/r")
    url = "http://127.0.0.1:9"
    env = {"OSMOSIS_PLATFORM_URL": url}
    with pytest.raises(
        AuthError, match=re.escape("Not logged in to http://127.0.0.1:9. Run 'osmosis auth login'")
    ):
        resolve_identity(env, cwd=ws, home=tmp_path / "home", workspace_name=None)
    write_credentials(tmp_path / "home", url, "file-token-123")
    found = resolve_identity(env, cwd=ws, home=tmp_path / "home", workspace_name=None)
    assert found.token == "file-token-123" and found.git_identity == "acme/r"
    assert "file-token-123" not in repr(found)
    with pytest.raises(AuthError, match=re.escape("OSMOSIS_TOKEN_PLATFORM_URL=http://127.0.0.1:9")):
        resolve_identity(
            {**env, "OSMOSIS_TOKEN": "env-token-1234"},
            cwd=ws,
            home=tmp_path / "home",
            workspace_name=None,
        )
    bound = {**env, "OSMOSIS_TOKEN": "env-token-1234", "OSMOSIS_TOKEN_PLATFORM_URL": url + "/"}
    assert (
        resolve_identity(bound, cwd=ws, home=tmp_path / "home", workspace_name=None).token
        == "env-token-1234"
    )
    creds = tmp_path / "home" / ".config" / "osmosis" / "credentials.json"
    doc = json.loads(creds.read_text())
    doc["platforms"][url]["expires_at"] = "2001-01-01T00:00:00+00:00"
    creds.write_text(json.dumps(doc))
    with pytest.raises(AuthError, match="expired"):
        resolve_identity(env, cwd=ws, home=tmp_path / "home", workspace_name=None)


def test_malformed_tokens_and_workspace_names_are_refused_in_one_line(tmp_path: Path) -> None:
    """A token a header cannot carry, or too short to be one (redacting it would mangle every
    message it occurs in), is refused without being shown; spaces around one are a paste's."""
    ws = _repo(tmp_path / "ws", "https://github.com/acme/r")
    url = "http://127.0.0.1:9"
    env = {"OSMOSIS_PLATFORM_URL": url, "OSMOSIS_TOKEN_PLATFORM_URL": url}
    home = tmp_path / "home"
    for bad in ("t", "tok en-with-a-space", "tøken-not-ascii", "token\nwith-a-break"):
        with pytest.raises(AuthError, match="malformed") as raised:
            resolve_identity({**env, "OSMOSIS_TOKEN": bad}, cwd=ws, home=home, workspace_name=None)
        assert len(bad) == 1 or bad not in str(raised.value)
    pasted = {**env, "OSMOSIS_TOKEN": "  env-token-1234\n"}
    assert resolve_identity(pasted, cwd=ws, home=home, workspace_name=None).token == (
        "env-token-1234"
    )
    for name in ("", "a\nb"):
        with pytest.raises(CLIError, match="is not a workspace name"):
            resolve_identity(pasted, cwd=ws, home=home, workspace_name=name)


def test_scope_and_insecure_platform(tmp_path: Path) -> None:
    write_credentials(tmp_path / "home", "http://127.0.0.1:9")
    env = {"OSMOSIS_PLATFORM_URL": "http://127.0.0.1:9"}
    (tmp_path / "plain").mkdir()
    with pytest.raises(CLIError, match=r"Set `origin`.*--workspace"):
        resolve_identity(env, cwd=tmp_path / "plain", home=tmp_path / "home", workspace_name=None)
    scoped = resolve_identity(
        env, cwd=tmp_path / "plain", home=tmp_path / "home", workspace_name="team"
    )
    assert (
        scoped.headers()["X-Osmosis-Workspace"] == "team"
        and "X-Osmosis-Git" not in scoped.headers()
    )
    with pytest.raises(CLIError, match="plain HTTP"):
        resolve_identity(
            {"OSMOSIS_PLATFORM_URL": "http://example.com"},
            cwd=tmp_path,
            home=tmp_path,
            workspace_name="t",
        )


def test_multipart_instructions_are_checked() -> None:
    def info(**kw: object) -> UploadInfo:
        base = {"method": "multipart", "part_size": 10, "total_parts": 3}
        urls = [{"part_number": n, "presigned_url": f"https://s3/{n}"} for n in (1, 2, 3)]
        return UploadInfo.parse({**base, "presigned_urls": urls, **kw})

    assert _parts(info(), 25)[1] == 3
    with pytest.raises(PutError, match="too small"):
        _parts(info(), 20)
    with pytest.raises(PutError, match="silently truncated"):
        _parts(info(), 31)
    with pytest.raises(PutError, match=r"Missing: \[3\]"):
        _parts(
            info(presigned_urls=[{"part_number": n, "presigned_url": "https://s"} for n in (1, 2)]),
            25,
        )
    with pytest.raises(PutError, match="must use HTTPS"):
        _parts(
            info(
                presigned_urls=[
                    {"part_number": n, "presigned_url": "http://s3.example/x"} for n in (1, 2, 3)
                ]
            ),
            25,
        )


def test_progress_line_has_bytes_rate_and_eta() -> None:
    now = [0.0]
    progress = UploadProgress(None, clock=lambda: now[0])
    progress.begin(4 * 1024 * 1024)
    now[0] = 2.0
    progress.advance(1024 * 1024)
    assert progress.line() == "1.0 MiB / 4.0 MiB · 512.0 KiB/s · ETA 6s"


def test_incomplete_run_is_not_uploaded_and_says_why(tmp_path: Path) -> None:
    ui = UI("plain", stdout=io.StringIO(), stderr=io.StringIO())
    step = AfterRunUpload(PlatformIdentity("http://127.0.0.1:9", "t" * 12, "a/b", None), False, ui)
    trio.run(step, tmp_path, False, None)
    message, steps, resource = step.amend("Evaluation run interrupted: x", ["Resume: y"], {})
    assert (
        message
        == "Evaluation run interrupted: x Upload skipped because the local evaluation is incomplete."
    )
    assert steps == ["Resume: y"] and "upload" not in resource


def test_run_argument_resolution(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "configs" / "eval").mkdir(parents=True)
    assert resolve_upload_dir("my-run", cwd=ws) == ws / ".osmosis" / "evals" / "my-run"
    assert resolve_upload_dir("./my-run", cwd=ws) == ws / "my-run"
    (ws / "here").mkdir()
    assert resolve_upload_dir("here", cwd=ws) == ws / "here"
    assert resolve_upload_dir("/abs/run", cwd=ws) == Path("/abs/run")


def test_retry_command_is_one_that_works_where_it_is_typed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "configs" / "eval").mkdir(parents=True)
    run_dir = ws / ".osmosis" / "evals" / "w1"
    run_dir.mkdir(parents=True)
    assert (
        retry_command(run_dir, replace=False, workspace_name=None, cwd=ws)
        == "rollbridge eval upload w1"
    )
    assert (
        retry_command(run_dir, replace=True, workspace_name="team a", cwd=ws / "configs")
        == "rollbridge eval upload w1 --replace --workspace 'team a'"
    )
    (tmp_path / "away").mkdir()
    assert (
        retry_command(run_dir, replace=False, workspace_name="t", cwd=tmp_path / "away")
        == f"rollbridge eval upload {run_dir} --workspace t"
    )


async def test_an_unreadable_platform_answer_is_a_platform_error(tmp_path: Path) -> None:
    import httpx

    from launcher.upload.import038 import Import038
    from launcher.upload.plan import build_plan
    from launcher.upload.transport import PlatformError
    from tests.upload.rundir import write_finished_run

    plan = build_plan(write_finished_run(tmp_path / "evals"))

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"not gzip")

    identity = PlatformIdentity("http://127.0.0.1:9", "t" * 12, "a/b", None)
    with trio.fail_after(10):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(PlatformError, match=r"^Platform request failed \(DecodingError\)$"):
                await Import038(identity, client).publish(
                    plan, replace=False, progress=UploadProgress(None)
                )


async def test_any_failure_of_the_after_run_upload_keeps_the_run_and_says_how_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from launcher.rundir.discard import CompleteRunError
    from launcher.upload import command

    async def broken(*args: object, **kwargs: object) -> None:
        raise httpx.InvalidURL("Invalid IPv6 URL")

    monkeypatch.setattr(command, "publish_run", broken)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "ws" / ".osmosis" / "evals" / "w1"
    ui = UI("plain", stdout=io.StringIO(), stderr=io.StringIO())
    step = AfterRunUpload(PlatformIdentity("http://127.0.0.1:9", "t" * 12, None, "team"), False, ui)
    with trio.fail_after(10), pytest.raises(CompleteRunError) as caught:
        await step(run_dir, True, None)
    assert caught.value.message == (
        f"Local evaluation results are complete at {run_dir}, but the local evaluation upload "
        "failed: InvalidURL: Invalid IPv6 URL\n"
        f"Retry with: rollbridge eval upload {run_dir} --workspace team"
    )


async def test_the_platforms_error_text_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    import httpx

    from launcher.upload.import038 import Import038
    from launcher.upload.plan import build_plan
    from launcher.upload.transport import PlatformError
    from tests.upload.rundir import write_finished_run

    plan = build_plan(write_finished_run(tmp_path / "evals"))
    body = {"error": "bad \x1b]0;owned\x07 \x9b2J", "issues": [{"path": ["a\x85"], "message": "m"}]}

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json=body)

    identity = PlatformIdentity("http://127.0.0.1:9", "t" * 12, "a/b", None)
    with trio.fail_after(10):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(PlatformError) as caught:
                await Import038(identity, client).publish(
                    plan, replace=False, progress=UploadProgress(None)
                )
    assert caught.value.message == "bad \\x1b]0;owned\\x07 \\x9b2J\n  - a\\x85: m"
