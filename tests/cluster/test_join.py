"""Joining the cluster fails fast, stays interruptible and keeps Ray's C++ lines off the
terminal (launcher.cluster.join); the helpers without Ray, the CLI with it (no root needed)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from h2.config import H2Configuration
from h2.connection import H2Connection

import launcher.cluster.join as join_module
from launcher.cluster.join import (
    JOIN_S,
    Fd2Capture,
    distinct_lines,
    failure,
    join,
    local_auth,
    local_start_cause,
    token_file_problem,
    unreachable,
)
from launcher.early_checks import check_ray_address
from launcher.errors import LocalEvalError
from tests.cluster.conftest import ClusterBed, slow_workspace
from tests.launcher.e2e.helpers import (
    base_env,
    count_log,
    process_gone,
    run_cli,
    run_dir,
    start_cli,
    wait_for,
)

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs Ray (the rollbridge[ray] extra)"
)
RAY_LINE = b"[2026-12-04 09:22:27,036 W 16894 16894] gcs_client.cc:210: no cluster id\n"


def _fd2_identity() -> tuple[int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino


def test_capture_takes_descriptor_2_and_gives_it_back() -> None:
    before = _fd2_identity()
    with Fd2Capture() as capture:
        assert _fd2_identity() != before
        os.write(2, RAY_LINE)
        os.write(2, RAY_LINE.replace(b"09:22:27", b"09:22:28"))
        os.write(2, b"rpc_client.h:153: Failed to connect\n")
        # From another thread, as the trio side does when Ray's call is abandoned.
        worker = threading.Thread(target=capture.restore)
        worker.start()
        worker.join()
        assert _fd2_identity() == before
        os.write(2, b"")  # after the restore: not captured
    text = capture.restore()
    assert text.count("no cluster id") == 2
    assert distinct_lines(text) == [
        ("gcs_client.cc:210: no cluster id", 2),
        ("rpc_client.h:153: Failed to connect", 1),
    ]
    assert _fd2_identity() == before


def test_distinct_lines_bounds_what_it_keeps() -> None:
    text = "".join(f"[t W 1 2] line {i}\n" for i in range(50)) + "[t W 1 2] line 3\n\n"
    kept = distinct_lines(text, limit=5)
    assert [line for line, _ in kept] == [f"line {i}" for i in range(5)]
    assert dict(kept)["line 3"] == 2


def test_failure_names_ray_s_cause_and_what_to_set_for_a_refused_token() -> None:
    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    assert failure(refused, []) == "Failed to connect to Ray cluster at 10.0.0.1:6379"
    said = distinct_lines(
        "[t W 1 2] gcs_client.cc:210: Failed to get cluster ID from GCS server: RpcError: "
        "RPC error: Received http2 header with status: 404 rpc_code: 12\n"
    )
    assert failure(refused, said) == (
        "Failed to connect to Ray cluster at 10.0.0.1:6379 (Ray: Failed to get cluster ID from "
        "GCS server: RpcError: RPC error: Received http2 header with status: 404 rpc_code: 12)"
    )
    said = distinct_lines(
        "[t W 1 2] gcs_client.cc:210: Failed to get cluster ID from GCS server: Unauthenticated: "
        "RPC error: InvalidAuthToken: Authentication token is missing or incorrect\n"
    )
    assert failure(refused, said) == (
        "the cluster refused the token (Authentication token is missing or incorrect): set "
        "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) to the token its "
        "nodes were started with"
    )


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


async def _h2_server(stream: trio.SocketStream) -> None:
    """Answers as a gRPC server does: its SETTINGS frame first (by the h2 library)."""
    connection = H2Connection(H2Configuration(client_side=False))
    connection.initiate_connection()
    await stream.send_all(connection.data_to_send())
    with contextlib.suppress(trio.BrokenResourceError):
        while data := await stream.receive_some(4096):
            connection.receive_data(data)
            await stream.send_all(connection.data_to_send())


async def test_unreachable_says_why_or_none(closed_port: int) -> None:
    with trio.fail_after(20):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.2")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, _h2_server, listeners)
            # Ray swaps a loopback host for the node's address: either answering will do.
            assert await unreachable(f"127.0.0.1:{port}", lambda: "127.0.0.2") is None
            assert await unreachable(f"127.0.0.2:{port}", lambda: "unused") is None
            why = await unreachable(f"localhost:{closed_port}", lambda: "127.0.0.3")
            assert why is not None
            assert f"localhost:{closed_port}: Connection refused" in why
            assert f"127.0.0.3:{closed_port}: Connection refused" in why
            assert why.startswith("nothing answers there (")
            # Not host:port: Ray's own error says so.
            assert await unreachable("nonsense", lambda: "unused") is None
            nursery.cancel_scope.cancel()


async def _web(stream: trio.SocketStream) -> None:
    await stream.receive_some(4096)
    await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    await stream.aclose()


async def _ssh(stream: trio.SocketStream) -> None:
    await stream.send_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    await trio.sleep_forever()


async def _closer(stream: trio.SocketStream) -> None:
    await stream.aclose()


async def _binary(stream: trio.SocketStream) -> None:
    await stream.receive_some(4096)
    await stream.send_all(bytes(range(40)))
    await trio.sleep_forever()


async def _silent(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


@pytest.mark.parametrize(
    ("serve", "said"),
    [
        (_web, "a service that answered 'HTTP/1.1 400 Bad Request'"),
        (_ssh, "a service that answered 'SSH-2.0-OpenSSH_9.2p1 Debian-2'"),
        (_closer, "a service that closed the connection without a word"),
        (_binary, "a service that answered 40 bytes that are not HTTP/2"),
    ],
)
async def test_another_service_at_the_address_is_named_at_once(
    serve: Callable[[trio.SocketStream], Awaitable[None]],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something else on the port (Ray's connect loop would take JOIN_S to give up): one
    line from the early checks, naming what answered; a silent service and a cluster whose
    gRPC is TLS are left to Ray."""
    monkeypatch.setattr(join_module, "PREFACE_S", 1.0)
    # check_ray_address asks Ray for this node's address (a loopback host): no Ray needed here.
    monkeypatch.setattr(join_module, "node_ip", lambda: "127.0.0.1")
    with trio.fail_after(20):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, serve, listeners)
            why = await unreachable(f"127.0.0.1:{port}", lambda: "unused", environ={})
            assert why == (
                f"{said} at 127.0.0.1:{port}, not a Ray head's GCS (its port is 6379 unless "
                "`ray start --head --port` said otherwise)"
            )
            tls = {"RAY_USE_TLS": "1"}
            assert await unreachable(f"127.0.0.1:{port}", lambda: "unused", environ=tls) is None
            with pytest.raises(LocalEvalError) as raised:
                await check_ray_address(f"127.0.0.1:{port}")
            assert str(raised.value) == f"could not join the Ray cluster at 127.0.0.1:{port}: {why}"
            nursery.cancel_scope.cancel()


async def test_a_silent_service_is_left_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(join_module, "PREFACE_S", 0.5)
    with trio.fail_after(20):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, _silent, listeners)
            assert await unreachable(f"127.0.0.1:{port}", lambda: "unused", environ={}) is None
            nursery.cancel_scope.cancel()


class _FakeRay:
    """Enough of Ray for ``join``: ``init`` writes as Ray's C++ client does, then fails or
    blocks until released."""

    def __init__(self, *, block: bool) -> None:
        self.block = block
        self.release = threading.Event()
        self.util = self
        self.entered = threading.Event()

    def get_node_ip_address(self) -> str:
        return "127.0.0.1"

    def init(self, **_: Any) -> None:
        os.write(2, RAY_LINE * 3)
        self.entered.set()
        if self.block:
            self.release.wait(30)
        raise ConnectionError("Failed to connect to Ray cluster")


async def test_join_failure_is_one_error_and_ray_lines_go_to_the_log() -> None:
    logged: list[tuple[str, str, str, Any]] = []
    before = _fd2_identity()
    with trio.fail_after(20):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        try:
            with pytest.raises(LocalEvalError) as raised:
                await join(
                    _FakeRay(block=False),
                    f"127.0.0.1:{port}",
                    "rollbridge_host",
                    lambda *entry: logged.append(entry),
                    "logs.txt",
                )
        finally:
            for listener in listeners:
                await listener.aclose()
    assert str(raised.value) == (
        f"could not join the Ray cluster at 127.0.0.1:{port}: Failed to connect to Ray cluster"
        " (Ray: no cluster id)\nLogs: logs.txt"
    )
    assert logged == [("WARNING", "cluster", "ray: gcs_client.cc:210: no cluster id", {"times": 3})]
    assert _fd2_identity() == before


async def test_join_is_abandoned_on_cancel_and_gives_descriptor_2_back() -> None:
    fake = _FakeRay(block=True)
    logged: list[Any] = []
    before = _fd2_identity()
    try:
        with trio.fail_after(20):
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def cancel_when_inside() -> None:
                        await trio.to_thread.run_sync(fake.entered.wait)
                        scope.cancel()

                    nursery.start_soon(cancel_when_inside)
                    await join(fake, "local", "r", lambda *e: logged.append(e), "logs.txt")
            assert scope.cancelled_caught
            assert _fd2_identity() == before
            assert len(logged) == 1
    finally:
        fake.release.set()


# The GCS's own log when Ray 2.60 started it in token mode without a token (2026-12-04).
GCS_DIED = (
    "[2026-12-04 12:29:53,941 I 31263 31263] (gcs_server) gcs_server_main.cc:98: Ray cluster "
    "metadata ray_version=2.60.0\n"
    "[2026-12-04 12:29:53,988 C 31263 31263] (gcs_server) authentication_token_loader.cc:115:  "
    "An unexpected system state has occurred. You have likely discovered a bug in Ray. Please "
    "report this issue at https://github.com/ray-project/ray/issues and we'll work with you to "
    "fix it. Check failed: has_token || ignore_auth_mode Token authentication is enabled but "
    "Ray couldn't find an authentication token.\n*** StackTrace Information ***\n"
)


def _session(temp: Path, err: str) -> Path:
    logs = temp / "session_2026-12-04_12-29-53_884834_31245" / "logs"
    logs.mkdir(parents=True)
    (logs / "gcs_server.err").write_text(err)
    (temp / "session_latest").symlink_to(logs.parent)
    return temp / "session_latest" / "logs"


def test_local_start_cause_is_the_first_fatal_line_of_a_fresh_session(tmp_path: Path) -> None:
    logs = _session(tmp_path / "ray", GCS_DIED)
    assert local_start_cause(tmp_path / "ray", 0.0) == (
        "gcs_server stopped: has_token || ignore_auth_mode Token authentication is enabled but "
        f"Ray couldn't find an authentication token. (Ray's logs: {logs})"
    )
    # An older session's log is not this start's cause; nothing fatal, no session: nothing.
    assert local_start_cause(tmp_path / "ray", logs.stat().st_mtime + 60) is None
    (logs / "gcs_server.err").write_text(GCS_DIED.splitlines()[0] + "\n")
    assert local_start_cause(tmp_path / "ray", 0.0) is None
    assert local_start_cause(tmp_path / "none", 0.0) is None


def test_local_auth_makes_a_token_only_when_none_is_configured() -> None:
    environ: dict[str, str] = {}
    token = local_auth(environ)
    assert token is not None and len(token) == 64
    assert environ == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    assert local_auth(environ) is None  # a second call keeps the first token
    assert environ["RAY_AUTH_TOKEN"] == token
    given = {"RAY_AUTH_TOKEN_PATH": "/t"}
    assert local_auth(given) is None
    assert given == {"RAY_AUTH_TOKEN_PATH": "/t", "RAY_AUTH_MODE": "token"}
    off = {"RAY_AUTH_MODE": "disabled"}
    assert local_auth(off) is None
    assert off == {"RAY_AUTH_MODE": "disabled"}


async def test_a_local_start_that_fails_names_the_dead_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    logs = _session(tmp_path / "ray", GCS_DIED)
    with trio.fail_after(20), pytest.raises(LocalEvalError) as raised:
        await join(_FakeRay(block=False), "local", "r", lambda *e: None, "logs.txt")
    assert str(raised.value) == (
        "could not join the Ray cluster at local: Failed to connect to Ray cluster (Ray: no "
        "cluster id): gcs_server stopped: has_token || ignore_auth_mode Token authentication is "
        f"enabled but Ray couldn't find an authentication token. (Ray's logs: {logs})"
        "\nLogs: logs.txt"
    )


@pytest.fixture
def ray_env(tmp_path: Path, slow_env: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    return base_env(
        UV_PROJECT_ENVIRONMENT=str(slow_env),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
    )


@needs_ray
@pytest.mark.slow
async def test_a_cluster_address_where_nothing_listens_fails_in_one_line(
    tmp_path: Path, ray_env: dict[str, str], closed_port: int
) -> None:
    slow_workspace(tmp_path / "ws", 0.0)
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/echo.toml", "--yes",
         "--ray", f"127.0.0.1:{closed_port}"],
        cwd=tmp_path,
        env=ray_env,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"Error: could not join the Ray cluster at 127.0.0.1:{closed_port}")
    assert "Connection refused" in errors[0]
    # Among the early checks: before the rollout's environment is synced or its server started.
    assert "work items pending" in result.stdout
    assert "syncing rollout dependencies" not in result.stdout


@needs_ray
@pytest.mark.slow
async def test_ray_alone_joins_the_cluster_ray_address_names(
    tmp_path: Path, ray_env: dict[str, str], closed_port: int
) -> None:
    """``--ray`` as the last word (no address): the address comes from ``RAY_ADDRESS`` and is
    checked like one given; with neither that nor a cluster ``ray start`` made, one line."""
    slow_workspace(tmp_path / "ws", 0.0)
    args = ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--ray"]
    named = {**ray_env, "RAY_ADDRESS": f"127.0.0.1:{closed_port}"}
    result = await run_cli(args, cwd=tmp_path, env=named, timeout=120)
    assert result.returncode == 1, result.stderr + result.stdout
    assert result.stderr.startswith(
        f"Error: could not join the Ray cluster at 127.0.0.1:{closed_port}: nothing answers"
    ), result.stderr
    alone = {**ray_env, "RAY_TMPDIR": str(tmp_path / "no-ray-here")}
    result = await run_cli(args, cwd=tmp_path, env=alone, timeout=120)
    assert result.returncode == 1, result.stderr + result.stdout
    assert result.stderr.startswith(
        "Error: --ray without an address joins this machine's Ray cluster, and there is none"
    ), result.stderr


@needs_ray
@pytest.mark.slow
async def test_ctrl_c_while_ray_cannot_connect_ends_the_run(
    tmp_path: Path, ray_env: dict[str, str]
) -> None:
    """Something answers TCP but never speaks Ray (Ray's connect loop would take minutes)."""
    ws = slow_workspace(tmp_path / "ws", 0.0)
    run = run_dir(ws, "stuck")
    with trio.fail_after(200):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        held: list[trio.SocketStream] = []

        async def hold(stream: trio.SocketStream) -> None:
            held.append(stream)
            await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, hold, listeners)
            cli = await start_cli(
                ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--plain",
                 "--name", "stuck", "--ray", f"127.0.0.1:{port}"],
                cwd=tmp_path,
                env=ray_env,
                logdir=tmp_path / "cli",
            )  # fmt: skip
            try:
                await wait_for(lambda: count_log(run, "joining Ray cluster") == 1, timeout=120)
                await wait_for(lambda: bool(held), timeout=60)  # Ray is inside its loop
                cli.signal(signal.SIGINT)
                result = await cli.wait(timeout=60)
            finally:
                if cli.process.returncode is None:
                    cli.kill9()
            nursery.cancel_scope.cancel()
    assert result.returncode == 130, result.stderr + result.stdout
    assert "gcs_client" not in result.stderr and "rpc_client" not in result.stderr
    assert process_gone(cli.process.pid)


@pytest.mark.slow
async def test_a_wrong_token_is_named_as_such(
    testbed: ClusterBed, slow_env: Path, tmp_path: Path
) -> None:
    """Ray's own error only says it failed to connect; its C++ client says why."""
    slow_workspace(tmp_path / "ws", 0.0)
    wrong = tmp_path / "wrong-token"
    wrong.write_text(secrets.token_hex(32))
    env = base_env(
        UV_PROJECT_ENVIRONMENT=str(slow_env), **{**testbed.env, "RAY_AUTH_TOKEN_PATH": str(wrong)}
    )
    result = await run_cli(
        ["eval", "run", "ws/configs/eval/echo.toml", "--yes", "--plain", "--ray", testbed.address],
        cwd=tmp_path,
        env=env,
        timeout=180,
    )
    assert result.returncode == 1, result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert "the cluster refused the token" in errors[0]
    assert "gcs_client" not in result.stderr


async def test_a_join_that_never_ends_is_given_up_with_one_line(autojump_clock: Any) -> None:
    """Something answers at the address but never as a Ray head (another service on the
    port): Ray's loop would go on for about 14 minutes; the join gives up after JOIN_S."""
    fake = _FakeRay(block=True)
    before = _fd2_identity()
    try:
        with trio.fail_after(JOIN_S * 2):
            with pytest.raises(LocalEvalError) as raised:
                await join(fake, "127.0.0.1:6398", "r", lambda *e: None, "logs.txt")
        assert str(raised.value).startswith(
            f"could not join the Ray cluster at 127.0.0.1:6398: no Ray cluster answered "
            f"within {JOIN_S:g} s"
        )
        assert str(raised.value).endswith("\nLogs: logs.txt")
        assert _fd2_identity() == before
    finally:
        fake.release.set()


async def test_a_token_file_that_cannot_serve_is_refused_before_ray_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing, empty, good = tmp_path / "missing", tmp_path / "empty", tmp_path / "token"
    empty.write_text(" \n")
    good.write_text("abc\n")
    assert token_file_problem({"RAY_AUTH_TOKEN_PATH": str(missing)}) == (
        f"RAY_AUTH_TOKEN_PATH names {missing}, which cannot be read (No such file or directory)"
    )
    assert token_file_problem({"RAY_AUTH_TOKEN_PATH": str(empty)}) == (
        f"RAY_AUTH_TOKEN_PATH names {empty}, which is empty"
    )
    assert token_file_problem({"RAY_AUTH_TOKEN_PATH": str(tmp_path)}) is not None  # a directory
    assert token_file_problem({"RAY_AUTH_TOKEN_PATH": str(good)}) is None
    # A token in the environment, or no authentication: the file is not used.
    assert token_file_problem({"RAY_AUTH_TOKEN_PATH": str(missing), "RAY_AUTH_TOKEN": "t"}) is None
    off = {"RAY_AUTH_TOKEN_PATH": str(missing), "RAY_AUTH_MODE": "disabled"}
    assert token_file_problem(off) is None
    assert token_file_problem({}) is None

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(missing))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    fake = _FakeRay(block=False)
    with trio.fail_after(20), pytest.raises(LocalEvalError) as raised:
        await join(fake, "10.0.0.1:6379", "r", lambda *e: None, "logs.txt")
    assert str(raised.value) == (
        f"could not join the Ray cluster at 10.0.0.1:6379: RAY_AUTH_TOKEN_PATH names {missing}, "
        "which cannot be read (No such file or directory); point it at the file holding the "
        "token the cluster's nodes were started with (or set RAY_AUTH_TOKEN)"
    )
    assert not fake.entered.is_set()  # Ray was not asked
