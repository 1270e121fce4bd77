"""A fake ``cloudflared`` for tests: same command line, same stderr, real HTTP forwarding.

Tests do not run this file directly; :func:`tests.fakes.cloudflared_support.install_fake_cloudflared`
writes an executable named ``cloudflared`` whose shebang is the current interpreter and which
runs :func:`main`.

It accepts only ``tunnel --config /dev/null --no-autoupdate --url <origin>`` (any order of the
options) and ``--version``. It prints trycloudflare-style lines on stderr (the URL box, a metrics
server line, ``Registered tunnel connection``), and serves two things on its own ports:

* the "public" side on ``FAKE_CLOUDFLARED_LISTEN`` (default 127.0.0.1), port 0: every request is
  forwarded to ``<origin>`` and the answer streamed back, like Cloudflare's edge would (each one
  is logged as ``DBG forwarded <method> <path> -> <status>``);
* a metrics server on 127.0.0.1 with ``/ready`` (200 while "connected", 503 after a simulated
  disconnect), like cloudflared's own.

The printed URL is ``https://<random words>.trycloudflare.com``, which resolves nowhere. Before
printing it, the fake writes ``<state dir>/<hostname>.json`` with ``{"local": "http://host:port",
"argv", "pid", "spawn", "metrics"}``; tests map the public URL to ``local`` through that file
(``cloudflared_support.FakeTunnelTransport`` / ``resolve_public_url``). Production parsing stays
strict; nothing in ``tunnel/`` knows about this mapping.

Knobs are environment variables ``FAKE_CLOUDFLARED_<NAME>``. Each value may be a comma-separated
list indexed by the spawn number (1st start, 2nd start, ...; the last value repeats), so a test can
make only the first process crash. The spawn number is counted in ``FAKE_CLOUDFLARED_STATE``.

=======================  ========================================================================
``STATE``                directory for the spawn counter and URL map files (required)
``LISTEN``               host of the public side (default ``127.0.0.1``)
``URL_DELAY``            seconds before the URL is printed (default 0)
``RATE_LIMIT``           1: print Cloudflare's 429/1015 lines and exit 1 before any URL
``EXIT_BEFORE_URL``      exit with this code before any URL (after an API error line)
``EXIT_AFTER_URL``       exit with this code right after printing the URL
``REGISTER``             0: never print ``Registered tunnel connection`` (default 1)
``REGISTER_DELAY``       seconds between URL and registration (default 0.05)
``EDGE_READY``           0: the public side answers 502 to everything (default 1)
``CRASH_AFTER_REQUESTS`` exit 1 right after answering this many forwarded requests (0 = never)
``CRASH_AFTER_SECONDS``  exit 1 this many seconds after the URL (0 = never)
``DISCONNECT_AFTER``     seconds after the URL when ``/ready`` turns 503 and the public side 530
``IGNORE_SIGTERM``       1: ignore SIGTERM (only SIGKILL stops it)
``GRANDCHILD``           1: start a sleeping child process in the same process group
``NOISE``                print this many ~100-byte log lines after registration (pipe pressure)
=======================  ========================================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_WORDS = ("amber", "basin", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


def _log(level: str, message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sys.stderr.write(f"{stamp} {level} {message}\n")
    sys.stderr.flush()


def _exit(code: int) -> None:
    # os._exit, not sys.exit: SystemExit inside trio's nurseries would be wrapped and lose the code.
    sys.stderr.flush()
    os._exit(code)


def _spawn_number(state: Path) -> int:
    n = 1
    while True:
        try:
            fd = os.open(state / f"spawn-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            n += 1
            continue
        os.close(fd)
        return n


def _knob(name: str, spawn: int, default: str) -> str:
    raw = os.environ.get(f"FAKE_CLOUDFLARED_{name}", "")
    if not raw:
        return default
    values = [v.strip() for v in raw.split(",")]
    return values[min(spawn, len(values)) - 1] or default


def _parse_argv(argv: list[str]) -> str | None:
    """Return the origin URL when argv is exactly what the tunnel package must pass."""
    if not argv or argv[0] != "tunnel":
        return None
    rest = argv[1:]
    seen: dict[str, str | None] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--no-autoupdate":
            seen[arg] = None
            i += 1
        elif arg in ("--config", "--url") and i + 1 < len(rest):
            seen[arg] = rest[i + 1]
            i += 2
        else:
            return None
    if seen.keys() != {"--no-autoupdate", "--config", "--url"} or seen["--config"] != os.devnull:
        return None
    return seen["--url"]


def main() -> None:
    argv = sys.argv[1:]
    if argv == ["--version"]:
        print("cloudflared version 2099.1.0 (fake, built for tests)")
        return
    origin = _parse_argv(argv)
    if origin is None:
        _log("ERR", f"fake cloudflared: unexpected arguments {argv!r}")
        sys.exit(2)
    state = Path(os.environ["FAKE_CLOUDFLARED_STATE"])
    spawn = _spawn_number(state)
    if _knob("IGNORE_SIGTERM", spawn, "0") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _knob("GRANDCHILD", spawn, "0") == "1":
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    import trio

    trio.run(_run, origin, state, spawn, argv)


async def _run(origin: str, state: Path, spawn: int, argv: list[str]) -> None:
    import trio

    knob = lambda name, default: _knob(name, spawn, default)  # noqa: E731
    _log(
        "INF",
        "Thank you for trying Cloudflare Tunnel. Doing so, without a Cloudflare account, is a "
        "quick way to experiment and try it out. (fake)",
    )
    _log("INF", "Requesting new quick Tunnel on trycloudflare.com...")
    if knob("RATE_LIMIT", "0") == "1":
        _log(
            "ERR",
            'Error unmarshaling QuickTunnel response: error code: 1015 error="invalid character '
            '\'e\' looking for beginning of value" status_code="429 Too Many Requests"',
        )
        _log("ERR", "failed to unmarshal quick Tunnel: invalid character 'e' looking for value")
        _exit(1)
    await trio.sleep(float(knob("URL_DELAY", "0")))
    exit_before = knob("EXIT_BEFORE_URL", "")
    if exit_before:
        _log(
            "ERR",
            'failed to request quick Tunnel: Post "https://api.trycloudflare.com/tunnel": '
            "dial tcp: lookup api.trycloudflare.com: no such host",
        )
        _exit(int(exit_before))

    app = _Edge(origin, knob)
    async with trio.open_nursery() as nursery:
        app.nursery = nursery
        public = await nursery.start(_serve, app, knob("LISTEN", "127.0.0.1"))
        metrics = await nursery.start(_serve, _Metrics(app), "127.0.0.1")
        hostname = "-".join(secrets.choice(_WORDS) for _ in range(3)) + "-" + secrets.token_hex(3)
        hostname += ".trycloudflare.com"
        info = {
            "local": public,
            "argv": argv,
            "pid": os.getpid(),
            "spawn": spawn,
            "metrics": metrics.removeprefix("http://"),
        }
        tmp = state / f".{hostname}.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(state / f"{hostname}.json")
        url = f"https://{hostname}"
        _log("INF", "+" + "-" * 90 + "+")
        _log(
            "INF",
            "|  Your quick Tunnel has been created! Visit it at (it may take some time to be reachable):  |",
        )
        _log("INF", f"|  {url:<86}  |")
        _log("INF", "+" + "-" * 90 + "+")
        _log("INF", "Version 2099.1.0 (fake)")
        _log("INF", f"Settings: map[ha-connections:1 no-autoupdate:true url:{origin}]")
        _log("INF", f"Starting metrics server on {info['metrics']}/metrics")
        exit_after = knob("EXIT_AFTER_URL", "")
        if exit_after:
            _exit(int(exit_after))
        nursery.start_soon(_signals)
        crash_after = float(knob("CRASH_AFTER_SECONDS", "0"))
        if crash_after:
            nursery.start_soon(_crash_later, crash_after)
        disconnect_after = float(knob("DISCONNECT_AFTER", "0"))
        if disconnect_after:
            nursery.start_soon(app.disconnect_later, disconnect_after)
        if knob("REGISTER", "1") == "1":
            await trio.sleep(float(knob("REGISTER_DELAY", "0.05")))
            _log(
                "INF",
                f"Registered tunnel connection connIndex=0 connection={secrets.token_hex(16)} "
                "event=0 ip=198.41.200.13 location=fake01 protocol=quic",
            )
        for i in range(int(knob("NOISE", "0"))):
            _log("DBG", f"fake noise line {i:06d} " + "x" * 80)


async def _signals() -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            _log("INF", f"Initiating graceful shutdown due to signal {signal.Signals(signum).name}")
            _exit(0)


async def _crash_later(seconds: float) -> None:
    import trio

    await trio.sleep(seconds)
    _log("ERR", "fake cloudflared: simulated crash")
    _exit(1)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _serve(app: Any, host: str, *, task_status: Any) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{host}:0"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 600
    import trio

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(app, config, task_status=task_status))
        task_status.started(binds[0])


class _Edge:
    """The public side: forwards every request to the origin, like Cloudflare's edge."""

    def __init__(self, origin: str, knob: Any) -> None:
        import httpx

        self.origin = origin.rstrip("/")
        self.ready = knob("EDGE_READY", "1") == "1"
        self.connected = True
        self.crash_after = int(knob("CRASH_AFTER_REQUESTS", "0"))
        self.answered = 0
        self.nursery: Any = None
        self.client = httpx.AsyncClient(timeout=None, trust_env=False)

    async def disconnect_later(self, seconds: float) -> None:
        import trio

        await trio.sleep(seconds)
        self.connected = False
        _log("ERR", 'Connection terminated error="fake: lost the edge" connIndex=0')

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if not self.ready or not self.connected:
            status = 502 if not self.ready else 530
            await _plain(send, status, f"error code: {status}".encode())
            return
        path = scope["raw_path"].decode("latin-1") or "/"
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in _HOP_BY_HOP
        ]
        import httpx

        request = self.client.build_request(
            scope["method"], self.origin + path, headers=headers, content=body
        )
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError:
            await _plain(send, 502, b"error code: 502")
            return
        try:
            out_headers = [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in response.headers.items()
                if k.lower() not in _HOP_BY_HOP
            ]
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": out_headers,
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()
        self.answered += 1
        _log("DBG", f"forwarded {scope['method']} {path} -> {response.status_code}")
        if self.crash_after and self.answered >= self.crash_after:
            self.nursery.start_soon(_crash_later, 0.05)


class _Metrics:
    """cloudflared's metrics server: ``/ready`` reports whether the edge connection is up."""

    def __init__(self, edge: _Edge) -> None:
        self.edge = edge

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope["path"] == "/ready":
            up = self.edge.connected
            body = json.dumps({"status": 200 if up else 503, "readyConnections": int(up)})
            await _plain(send, 200 if up else 503, body.encode(), b"application/json")
        elif scope["path"] == "/metrics":
            await _plain(send, 200, b"# fake cloudflared metrics\n")
        else:
            await _plain(send, 404, b"404 page not found\n")


async def _plain(send: Any, status: int, body: bytes, ctype: bytes = b"text/plain") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
