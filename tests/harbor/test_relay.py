"""The exec relay through a real ``--network none`` podman container.

A container of ``local/bookworm-harbor`` with no network (only ``lo``) reaches a server on the
host's 127.0.0.1 through ``podman exec -i <ctr> python3 -u -c <inside_source()> 13131``: requests
from curl and from ``urllib`` in the container, several at once; a streamed (SSE-style) response
arriving chunk by chunk while the host server is held before its last chunk; and, once the relay
is closed (stdin EOF, or a SIGKILL of its process group), no relay or ``podman exec`` process
left on the host nor in the container, and the container removed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psutil
import pytest
import trio

from tests.rollout_server.test_relay_frames import (
    RELAY_FILE,
    HttpTarget,
    expected_order,
    relay,
    relay_cli,
    run_http_target,
)

IMAGE = "local/bookworm-harbor"
TEST_LABEL = "io.rollbridge.test"
PORT = 13131

#: Counts processes in the container whose command line is the relay's (its source has the word).
SCAN = """import os
me = str(os.getpid())
found = 0
for pid in os.listdir("/proc"):
    if pid.isdigit() and pid != me:
        try:
            cmdline = open("/proc/%s/cmdline" % pid, "rb").read()
        except OSError:
            continue
        found += b"rollbridge" + b"-relay" in cmdline
print(found)
"""

#: Ten concurrent POSTs with distinct bodies from inside the container, checked there.
CONCURRENT = """import threading, urllib.request
results = {}
def call(i):
    body = ("call-{}-".format(i) * (5000 + 97 * i)).encode()
    request = urllib.request.Request("http://127.0.0.1:PORT/echo", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        results[i] = response.read() == body
threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(results.values()))
""".replace("PORT", str(PORT))


@pytest.fixture
def container(testbed: None) -> Iterator[str]:
    """A ``--network none`` container, removed (and checked gone) afterwards."""
    name = f"rollbridge-relay-test-{uuid.uuid4().hex[:10]}"
    label = f"{TEST_LABEL}=relay-{name}"
    try:
        run = ["podman", "run", "-d", "--name", name, "--network", "none", "--label", label]
        subprocess.run(
            [*run, IMAGE, "sleep", "300"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield name
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)
        listed = subprocess.run(
            ["podman", "ps", "-a", "-q", "--filter", f"label={label}"],
            capture_output=True,
            timeout=60,
            check=True,
        )
        assert listed.stdout.strip() == b"", f"container {name} was not removed"


def exec_argv(name: str) -> list[str]:
    return ["podman", "exec", "-i", name, "python3", "-u", "-c", relay.inside_source(), str(PORT)]


def host_processes_of(name: str) -> set[int]:
    """Host processes whose command line names the container (podman exec, the relay CLI)."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if name in (proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            pass
    return found


async def in_container(name: str, *argv: str) -> str:
    result = await trio.run_process(
        ["podman", "exec", name, *argv], capture_stdout=True, capture_stderr=True, check=False
    )
    assert result.returncode == 0, result.stderr.decode()[-500:]
    return result.stdout.decode()


async def relays_in_container(name: str) -> int:
    return int(await in_container(name, "python3", "-c", SCAN))


async def wait_until_no_relay_left(name: str, before: set[int]) -> None:
    """Until no host process but ``before`` (the container's own conmon) names the container
    and no relay runs inside it. Polls under the caller's fail_after; the inside end exits on
    its stdin's EOF."""
    while host_processes_of(name) - before or await relays_in_container(name):
        await trio.sleep(0.2)


async def stream_through_curl(name: str, target: HttpTarget) -> list[str]:
    """``curl -N`` in the container; each chunk printed opens the server's next gate."""
    url = f"http://127.0.0.1:{PORT}/stream"
    process = await trio.lowlevel.open_process(
        ["podman", "exec", name, "curl", "-sS", "-N", url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    order: list[str] = []
    seen = b""
    index = 0
    while data := await process.stdout.receive_some(4096):
        seen += data
        while index < target.chunks and target.chunk(index) in seen:
            if index < target.chunks - 1:
                order.append(f"got {index} (last written: {target.written[-1].is_set()})")
            else:
                order.append(f"got {index}")
            target.gates[index].set()
            index += 1
    assert await process.wait() == 0
    assert index == target.chunks, seen
    return order


async def test_a_network_none_container_reaches_the_host_through_the_relay(
    container: str, nursery: trio.Nursery
) -> None:
    with trio.fail_after(180):
        target = await nursery.start(run_http_target, HttpTarget(chunks=4))
        # The container has no way out on its own.
        refused = await trio.run_process(
            ["podman", "exec", container, "curl", "-sS", f"http://127.0.0.1:{target.port}/"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert refused.returncode == 7  # connection refused: its loopback is its own
        before = host_processes_of(container)
        async with relay_cli(target.port, exec_argv(container)) as cli:
            assert cli.port == PORT
            echoed = await in_container(
                container, "curl", "-sS", "--data-binary", "hello", f"http://127.0.0.1:{PORT}/echo"
            )
            assert echoed == "hello"
            assert await in_container(container, "python3", "-c", CONCURRENT) == "10\n"
            assert await stream_through_curl(container, target) == expected_order(4)
            assert await relays_in_container(container) == 1
            assert host_processes_of(container) - before
        assert cli.process.returncode == 0
        assert cli.stderr == []
        await wait_until_no_relay_left(container, before)


async def test_a_group_kill_leaves_no_relay_behind(container: str, nursery: trio.Nursery) -> None:
    with trio.fail_after(120):
        target = await nursery.start(run_http_target, HttpTarget())
        before = host_processes_of(container)
        argv = [sys.executable, str(RELAY_FILE), "host", "--target", f"127.0.0.1:{target.port}"]
        process = await trio.lowlevel.open_process(
            [*argv, "--", *exec_argv(container)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            assert await process.stdout.receive_some(6) == b"READY\n"
            group = [p.pid for p in psutil.Process(process.pid).children()]
            assert group and all(os.getpgid(pid) == process.pid for pid in group)
            assert await relays_in_container(container) == 1
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            await wait_until_no_relay_left(container, before)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_start_host_relay_serves_curl_in_the_container(
    container: str, nursery: trio.Nursery
) -> None:
    with trio.fail_after(120):
        target = await nursery.start(run_http_target, HttpTarget())
        before = host_processes_of(container)
        logged: list[str] = []

        async def scenario() -> tuple[str, int | None]:
            host = await relay.start_host_relay(
                exec_argv(container), ("127.0.0.1", target.port), log=logged.append
            )
            async with host:
                curl = await asyncio.create_subprocess_exec(
                    *["podman", "exec", container, "curl", "-sS", "--data-binary", "via asyncio"],
                    f"http://127.0.0.1:{PORT}/echo",
                    stdout=asyncio.subprocess.PIPE,
                )
                out, _ = await curl.communicate()
            return out.decode(), host.returncode

        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["value"] = asyncio.run(scenario())
            except BaseException as exc:
                result["error"] = exc

        await trio.to_thread.run_sync(run)
        assert "error" not in result, result
        assert result["value"] == ("via asyncio", 0)
        assert logged == []
        await wait_until_no_relay_left(container, before)
