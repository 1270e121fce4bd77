"""A tiny Chrome DevTools Protocol client for the browser tests and the benchmark: headless
Chromium started on ``--remote-debugging-port=0``, one page target in flattened-session mode,
a websocket spoken with wsproto (already installed through hypercorn) over a trio stream.

Only what the tests need: navigate, evaluate JavaScript, type text, take a screenshot. Calls
are sequential; events arriving in between are dropped.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    Request,
    TextMessage,
)

__all__ = ["Browser", "chromium_path", "decode_png", "file_url", "open_browser"]

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
)
_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


def chromium_path() -> str | None:
    """The Chromium binary on PATH (Debian's ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One websocket to the browser, with a page session attached."""

    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self._stream = stream
        self._ws = ws
        self._next_id = 0
        self._pending: list[str] = []
        self._text: list[str] = []
        self.session: str | None = None

    async def _receive_text(self) -> str:
        while not self._pending:
            data = await self._stream.receive_some(65536)
            if not data:
                raise ConnectionError("browser closed the DevTools socket")
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, TextMessage):
                    self._text.append(event.data)
                    if event.message_finished:
                        self._pending.append("".join(self._text))
                        self._text.clear()
                elif isinstance(event, Ping):
                    await self._stream.send_all(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    raise ConnectionError("browser closed the DevTools socket")
        return self._pending.pop(0)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one command (to the page session when attached) and return its result."""
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith("Target."):
            command["sessionId"] = self.session
        await self._stream.send_all(self._ws.send(Message(data=json.dumps(command))))
        while True:
            reply = json.loads(await self._receive_text())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises awaited)."""
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, interval: float = 0.02) -> Any:
        """Poll ``expression`` until it is truthy (the caller bounds it with fail_after)."""
        while not (value := await self.evaluate(expression)):
            await trio.sleep(interval)
        return value

    async def navigate(self, url: str) -> None:
        """Load ``url`` in the page."""
        await self.call("Page.navigate", {"url": url})

    async def type_text(self, selector: str, text: str) -> None:
        """Focus ``selector`` and type ``text`` as real keyboard input."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.call("Input.insertText", {"text": text})

    async def screenshot(self) -> bytes:
        """A PNG of the viewport."""
        result = await self.call("Page.captureScreenshot", {"format": "png"})
        return base64.b64decode(result["data"])


async def _read_ws_url(process: trio.Process) -> str:
    assert process.stderr is not None
    seen = b""
    while (match := _LISTENING.search(seen)) is None:
        chunk = await process.stderr.receive_some(4096)
        if not chunk:
            raise RuntimeError(f"chromium exited before DevTools listened: {seen[-500:]!r}")
        seen += chunk
    return match.group(1).decode()


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some(65536):
        pass


@asynccontextmanager
async def open_browser(
    binary: str, width: int = 1400, height: int = 1000
) -> AsyncIterator[Browser]:
    """Start headless Chromium and yield a :class:`Browser` attached to one blank page."""
    with tempfile.TemporaryDirectory(prefix="rb-chromium-", ignore_cleanup_errors=True) as profile:
        # Its own session, so stopping it stops its renderer and zygote children too.
        process = await trio.lowlevel.open_process(
            [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            url = await _read_ws_url(process)
            async with trio.open_nursery() as nursery:
                assert process.stderr is not None
                # Chromium keeps writing to stderr; an unread pipe would block it.
                nursery.start_soon(_drain, process.stderr)
                parts = urlsplit(url)
                stream = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 0)
                ws = WSConnection(ConnectionType.CLIENT)
                await stream.send_all(ws.send(Request(host=parts.netloc, target=parts.path)))
                accepted = False
                while not accepted:
                    ws.receive_data(await stream.receive_some(65536))
                    accepted = any(isinstance(e, AcceptConnection) for e in ws.events())
                browser = Browser(stream, ws)
                target = await browser.call("Target.createTarget", {"url": "about:blank"})
                attached = await browser.call(
                    "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
                )
                browser.session = attached["sessionId"]
                await browser.call(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                await browser.call("Page.enable")
                await browser.call("Runtime.enable")
                try:
                    yield browser
                finally:
                    with trio.move_on_after(5, shield=True):
                        await browser.call("Browser.close")
                        await process.wait()
                    await stream.aclose()
                    nursery.cancel_scope.cancel()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await process.wait()


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """``(width, height, rows)`` of an 8-bit RGB/RGBA PNG, rows unfiltered (bytes per row =
    width * channels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = prev[i]
            up_left = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else up_left
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def file_url(path: Path) -> str:
    """``file://`` URL of ``path``."""
    return path.resolve().as_uri()
