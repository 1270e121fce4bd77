"""A page of another origin (as an editor's webview is) calling the daemon's ``--http``
listener from real headless Chromium: with ``--allow-origin`` its preflight is answered and
its reads and writes go through with the token; without, the browser blocks them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.daemon.helpers import running_daemon
from tests.reporting.cdp import chromium_path, open_browser

PAGE = b"<!doctype html><title>webview</title><p>a page of another origin"


async def _serve_page(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A one-page HTTP server on 127.0.0.1:0 (the page's origin)."""

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                request += chunk
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n"
            await stream.send_all(head + b"content-length: %d\r\n\r\n" % len(PAGE) + PAGE)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


def _calls(url: str, token: str) -> str:
    """JS: a GET and a POST as a webview makes them; each outcome as a string."""
    return f"""(async () => {{
      const out = [];
      const auth = {{Authorization: 'Bearer ' + {json.dumps(token)}}};
      for (const [method, path, body] of [['GET', '/v1/daemon', null],
                                          ['POST', '/v1/runs', '{{}}']]) {{
        try {{
          const headers = body ? {{...auth, 'Content-Type': 'application/json'}} : auth;
          const r = await fetch({json.dumps(url)} + path, {{method, headers, body}});
          const doc = await r.json();
          out.push(method + ' ' + r.status + ' ' + (doc.error ? doc.error.code : doc.pid));
        }} catch (e) {{ out.push(method + ' blocked ' + e.name); }}
      }}
      return out;
    }})()"""


@pytest.mark.parametrize("allowed", [True, False])
async def test_a_page_of_an_allowed_origin_calls_the_api_with_the_token(
    workspace: Path, env: dict[str, str], allowed: bool
) -> None:
    chromium = chromium_path()
    if chromium is None:
        pytest.skip("needs Chromium on PATH (Debian's chromium package)")
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            page_port: Any = await nursery.start(_serve_page)
            origin = f"http://127.0.0.1:{page_port}"
            extra = ("--allow-origin", origin) if allowed else ()
            async with running_daemon(workspace, env, "--http", *extra) as daemon:
                assert daemon.info.url is not None and daemon.info.token
                async with open_browser(chromium) as browser:
                    await browser.navigate(origin + "/")
                    await browser.wait_for("document.readyState === 'complete'")
                    outcomes = await browser.evaluate(_calls(daemon.info.url, daemon.info.token))
            nursery.cancel_scope.cancel()
    if allowed:
        # The read answers; the write reaches the API (a start without a config: its 400).
        assert outcomes == [f"GET 200 {daemon.process.pid}", "POST 400 VALIDATION"]
    else:
        assert outcomes == ["GET blocked TypeError", "POST blocked TypeError"]
