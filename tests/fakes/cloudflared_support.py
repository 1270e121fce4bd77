"""Test-side helpers for the fake cloudflared (see tests/fakes/cloudflared.py).

* :func:`install_fake_cloudflared` writes an executable ``cloudflared`` (shebang: this interpreter).
* :func:`resolve_public_url` maps ``https://<host>.trycloudflare.com`` to the fake's local address
  through the map file the fake wrote before printing the URL.
* :class:`FakeTunnelTransport` is an httpx transport doing that mapping for every request, so a
  client (or the tunnel's readiness probe, via ``TunnelOptions.probe_transport``) can use the
  public URL as if DNS resolved it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_SOURCE = Path(__file__).resolve().with_name("cloudflared.py")


def install_fake_cloudflared(directory: Path) -> Path:
    """Write ``<directory>/cloudflared`` running the fake with this interpreter; return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "cloudflared"
    binary.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from tests.fakes.cloudflared import main\n"
        "main()\n"
    )
    binary.chmod(0o755)
    return binary


def fake_info(state: Path, public_url: str) -> dict[str, Any]:
    """What the fake recorded for the tunnel behind ``public_url`` (local address, argv, pid...)."""
    host = urlsplit(public_url).hostname or ""
    return json.loads((state / f"{host}.json").read_text())


def resolve_public_url(state: Path, public_url: str) -> str:
    """Map a fake public URL (with any path) onto the fake's own local address."""
    parts = urlsplit(public_url)
    local = fake_info(state, public_url)["local"]
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return local + rest


class FakeTunnelTransport(httpx.AsyncBaseTransport):
    """Send requests for ``*.trycloudflare.com`` to the fake that published that hostname.

    An unknown hostname fails like an unresolvable one (``httpx.ConnectError``).
    """

    def __init__(self, state: Path) -> None:
        self._state = state
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host.endswith(".trycloudflare.com"):
            path = self._state / f"{host}.json"
            if not path.exists():
                raise httpx.ConnectError(f"[fake DNS] {host} does not resolve", request=request)
            local = httpx.URL(json.loads(path.read_text())["local"])
            request.url = request.url.copy_with(
                scheme=local.scheme, host=local.host, port=local.port
            )
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
