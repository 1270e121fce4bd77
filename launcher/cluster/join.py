"""Joining the Ray cluster as the run's driver, failing fast and quietly when it cannot be done.

Three things ``ray.init`` does badly for a command-line tool, measured with Ray 2.60:

* **An address where nothing listens takes about 14 minutes to fail**: its connect loop makes
  20 attempts, each waiting 5 s for the GCS, 5 s for its pubsub and 30 s for the cluster id.
  :func:`unreachable` opens a plain TCP connection to the address (to the node's own address
  too for a loopback host, as Ray swaps one for the other) among the run's early checks
  (:mod:`launcher.early_checks`, before ``uv sync``), so a wrong host or port is one line
  within :data:`CONNECT_S`; and it sends the HTTP/2 preface there, so another service on the
  port (one that answers as something else: a web server, SSH, Redis) is one line at once
  instead of :data:`JOIN_S` later.
* **It cannot be interrupted**: it blocks a worker thread in C++. The call is abandoned on
  cancellation (Ctrl-C ends the run at once; the thread is a daemon and ends with the process).
* **Its C++ client writes straight to descriptor 2** (a warning line per attempt: ``[time W
  pid tid] gcs_client.cc:…``), past Python's ``sys.stderr`` and Ray's ``logging_level``;
  ``RAY_BACKEND_LOG_LEVEL`` does not quiet it. Over a terminal those lines bury the one-line
  error. :class:`Fd2Capture` points descriptor 2 at an unnamed temporary file while the driver
  connects, and :func:`distinct_lines` turns what came into the run's log (each distinct
  message once, with its count).

And one thing it does badly for ``--ray local``: Ray reads ``RAY_AUTH_MODE`` into its C++
configuration when ``ray`` is first imported. Set after the import (as this module did until
2026-12-04), the mode reaches the GCS that ``ray.init`` spawns, which then needs a token, but
not ``ray.init`` itself, which neither makes nor passes one: on a machine without
``~/.ray/auth_token`` the GCS exits and ``ray.init`` fails 30 s later with "Timed out waiting
for file …/gcs_server_port_…". :func:`local_auth` sets the mode, and a token made for the run
when none is configured, before the import.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from functools import partial
from pathlib import Path
from typing import Any

import trio

from launcher.cluster.flags import ray_temp_dir
from launcher.config_ray import split_address
from launcher.errors import DependencyError, LocalEvalError
from rollout_server.net.hosts import is_loopback_host

__all__ = [
    "CONNECT_S",
    "JOIN_S",
    "LOCAL_LOGS",
    "MAX_KEPT",
    "Fd2Capture",
    "distinct_lines",
    "failure",
    "import_ray",
    "join",
    "local_auth",
    "local_start_cause",
    "node_ip",
    "not_grpc",
    "token_file_problem",
    "unreachable",
]

#: How long the TCP check waits for each address before calling it unreachable.
CONNECT_S = 5.0
#: How long joining a cluster at an address may take (a join takes seconds; a refused token,
#: about 20). Something that answers TCP there but is not a Ray head (another service on the
#: port) kept Ray's connect loop going for about 14 minutes.
JOIN_S = 60.0
#: The most captured bytes read back (the tail: a failure's cause comes last).
MAX_KEPT = 64 * 1024
_PREFIX = re.compile(r"^\[[^\]]*\]\s*")
_SOURCE = re.compile(r"^[\w.]+\.(?:cc|cpp|h):\d+:\s*")  # Ray's "gcs_client.cc:210: "
# A fatal line of a Ray process's log: "[2026-12-04 12:29:53,988 C 31263 31263] (gcs_server) ".
_FATAL = re.compile(r"^\[\S+ \S+ [CF] \d+ \d+\]\s*(?:\(\w+\)\s*)?")
#: The logs of the processes ``ray.init`` starts for ``--ray local``, in the order read.
LOCAL_LOGS = ("gcs_server.err", "raylet.err", "gcs_server.out", "raylet.out")

LogFn = Callable[[str, str, str, "dict[str, Any] | None"], Any]


class Fd2Capture:
    """``with Fd2Capture() as cap: ...`` sends what is written to descriptor 2 to a temporary
    file until :meth:`restore` (or the block's end), which returns it.

    Anything else written to descriptor 2 meanwhile (another thread's stderr) is captured too:
    the caller logs it, so nothing is lost. :meth:`restore` may be called from any thread, more
    than once; the first call restores the descriptor.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._saved = -1
        self._file: Any = None
        self._text = ""

    def __enter__(self) -> Fd2Capture:
        self._file = tempfile.TemporaryFile()
        sys.stderr.flush()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> str:
        """Point descriptor 2 back where it was; what was written to it meanwhile."""
        with self._lock:
            if self._saved >= 0:
                os.dup2(self._saved, 2)
                os.close(self._saved)
                self._saved = -1
                size = self._file.seek(0, os.SEEK_END)
                self._file.seek(max(0, size - MAX_KEPT))
                self._text = self._file.read().decode("utf-8", "replace")
                self._file.close()
            return self._text


def distinct_lines(text: str, limit: int = 20) -> list[tuple[str, int]]:
    """Each distinct non-empty line of ``text`` (its ``[time level pid tid]`` prefix removed),
    in order of first appearance, with its count; at most ``limit`` of them."""
    counts: dict[str, int] = {}
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).strip()
        if line and (line in counts or len(counts) < limit):
            counts[line] = counts.get(line, 0) + 1
    return list(counts.items())


def failure(exc: Exception, said: list[tuple[str, int]]) -> str:
    """A failed join in words: Ray's exception says only "Failed to connect"; the cause is in
    the last line its C++ client wrote, and a refused token gets what to set."""
    if not said:
        return str(exc)
    cause = _SOURCE.sub("", said[-1][0])
    if "InvalidAuthToken" in cause or "Unauthenticated" in cause:
        return (
            f"the cluster refused the token ({cause.rpartition(': ')[2]}): set RAY_AUTH_MODE=token "
            "and RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) to the token its nodes were started with"
        )
    return f"{exc} (Ray: {cause})"


def local_start_cause(temp_dir: Path, since: float) -> str | None:
    """Why the local cluster's processes died: the first fatal line of the newest session's
    GCS or raylet log (``ray.init`` says only that it timed out waiting for their files), with
    where the logs are; None when that session is older than ``since`` or says nothing."""
    logs = temp_dir / "session_latest" / "logs"
    try:
        if logs.stat().st_mtime < since:
            return None
    except OSError:
        return None
    for name in LOCAL_LOGS:
        try:
            with (logs / name).open("rb") as f:
                text = f.read(MAX_KEPT).decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            if fatal := _FATAL.match(line):
                said = _SOURCE.sub("", line[fatal.end() :]).strip()
                said = said.partition("Check failed: ")[2] or said  # past Ray's boilerplate
                return f"{name.partition('.')[0]} stopped: {said[:300]} (Ray's logs: {logs})"
    return None


def _why(exc: OSError) -> str:
    """The first underlying error's words: trio's "all attempts to connect … failed" chains
    each attempt's own error (an exception group) as its cause."""
    cause = exc.__cause__
    while isinstance(cause, BaseExceptionGroup):
        cause = cause.exceptions[0]
    for err in (cause, exc):
        if isinstance(err, OSError) and err.strerror:  # trio's: "Error connecting to …: why"
            return str(err.strerror).rpartition(": ")[2]
    return str(exc)


async def unreachable(
    address: str, node_ip: Callable[[], str], *, environ: Mapping[str, str] = os.environ
) -> str | None:
    """Why ``address`` (``host:port``) cannot be a Ray head's GCS, or None when it may be.

    Nothing answering TCP there is a reason; so is a service that answers the HTTP/2 preface
    as something else (:func:`not_grpc`: a web server's ``HTTP/1.1 400``, an SSH banner, a
    Redis error, a connection closed at once), which kept Ray's connect loop going for
    :data:`JOIN_S`. For a loopback host Ray connects to ``node_ip()`` instead, so either
    answering will do. An address that is not ``host:port`` is left to Ray, whose own error is
    clear (None)."""
    parsed = split_address(address)
    if parsed is None:
        return None
    host, port = parsed
    hosts = [host]
    if is_loopback_host(host):
        hosts.append(await trio.to_thread.run_sync(node_ip))
    reasons: list[str] = []
    for candidate in hosts:
        with trio.move_on_after(CONNECT_S) as waited:
            try:
                stream = await trio.open_tcp_stream(candidate, port)
            except OSError as exc:
                reasons.append(f"nothing answers there ({candidate}:{port}: {_why(exc)})")
                continue
        if waited.cancelled_caught:
            reasons.append(
                f"nothing answers there ({candidate}:{port}: no answer within {CONNECT_S:g} s)"
            )
            continue
        try:
            # A cluster whose gRPC runs over TLS (RAY_USE_TLS) answers a plain preface with
            # nothing useful: left to Ray.
            if environ.get("RAY_USE_TLS", "").lower() in ("1", "true"):
                return None
            other = await not_grpc(stream)
        finally:
            await stream.aclose()
        if other is None:
            return None
        return (
            f"{other} at {candidate}:{port}, not a Ray head's GCS (its port is 6379 unless "
            "`ray start --head --port` said otherwise)"
        )
    return "; ".join(reasons)


#: How long :func:`not_grpc` waits for the answer to its HTTP/2 preface.
PREFACE_S = 5.0


async def not_grpc(stream: trio.abc.Stream) -> str | None:
    """What answered the HTTP/2 client preface on ``stream``, when it is not an HTTP/2 server
    (a Ray head's GCS is gRPC, whose first frame must be its SETTINGS, RFC 9113 3.4); None when
    it is one, or when nothing came within :data:`PREFACE_S` (a silent service is left to
    Ray's own timeout: a loaded head may be slow to answer). The preface is the ``h2``
    library's, the answer's frame header read by ``hyperframe`` (h2's own parser)."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from hyperframe.exceptions import HyperframeError
    from hyperframe.frame import Frame, SettingsFrame

    connection = H2Connection(H2Configuration(client_side=True))
    connection.initiate_connection()
    heard = b""
    with trio.move_on_after(PREFACE_S):
        try:
            await stream.send_all(connection.data_to_send())
            while len(heard) < 9:  # a frame header
                chunk = await stream.receive_some(256)
                if not chunk:
                    break
                heard += chunk
        except trio.BrokenResourceError:
            pass
        if not heard:
            return "a service that closed the connection without a word"
        if len(heard) >= 9:
            try:
                frame, length = Frame.parse_frame_header(memoryview(heard[:9]))
            except HyperframeError:
                frame, length = None, 0
            if isinstance(frame, SettingsFrame) and frame.stream_id == 0 and length % 6 == 0:
                return None
        return f"a service that answered {_first_words(heard)}"
    return None


def _first_words(heard: bytes) -> str:
    """The start of ``heard`` for a message: its first line when it is text, else its size."""
    line = heard.split(b"\n", 1)[0].strip()
    text = line.decode("latin-1")
    if text and all(c.isprintable() for c in text):
        return repr(text[:60] + ("..." if len(text) > 60 else ""))
    return f"{len(heard)} bytes that are not HTTP/2"


def import_ray() -> Any:
    """The ``ray`` module; without it, the one-line error that names the extra."""
    # Ray's driver installs Abseil's failure-signal handler, SIGTERM among its signals: a
    # SIGTERM then printed a C++ stack dump to the terminal and, about one time in three,
    # aborted the supervisor (exit 134, no final record) instead of reaching its own two-stage
    # stop (launcher.signals), which a local run gets. Read when ray is first imported.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError:
        raise DependencyError(
            "--ray needs Ray: install rollbridge[ray] (pip install 'rollbridge[ray]')"
        ) from None
    return ray


def node_ip() -> str:
    """The address Ray puts in place of a loopback host (imports Ray: call on a thread)."""
    return str(import_ray().util.get_node_ip_address())


def local_auth(environ: MutableMapping[str, str]) -> str | None:
    """Token authentication for the cluster ``--ray local`` starts, set in ``environ`` (call
    before ``ray`` is imported; see the module docstring). Unless the user turned it off
    (``RAY_AUTH_MODE=disabled``) or gave a token (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``),
    the cluster gets a token made for this run, held in the environment only (the cluster's
    processes inherit it; nothing is written to ``~/.ray``). Returns that token (for the
    redactor), or None."""
    if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    environ["RAY_AUTH_MODE"] = "token"
    if environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    token = secrets.token_hex(32)
    environ["RAY_AUTH_TOKEN"] = token
    return token


def token_file_problem(environ: Mapping[str, str]) -> str | None:
    """Why the token file ``RAY_AUTH_TOKEN_PATH`` names cannot serve (Ray's own message is a
    paragraph with a link); None when it can, or when no file is in use."""
    path = environ.get("RAY_AUTH_TOKEN_PATH")
    if (
        not path
        or environ.get("RAY_AUTH_TOKEN")
        or environ.get("RAY_AUTH_MODE", "").lower() == "disabled"
    ):
        return None
    try:
        with open(path, "rb") as file:
            empty = not file.read(4096).strip()
    except OSError as exc:
        return f"RAY_AUTH_TOKEN_PATH names {path}, which cannot be read ({_why(exc)})"
    if empty:
        return f"RAY_AUTH_TOKEN_PATH names {path}, which is empty"
    return None


def _init(ray: Any, address: str, resource: str) -> tuple[str, str]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # The run's address is explicit (--ray alone was resolved from RAY_ADDRESS before the run):
    # nothing Ray starts from here needs the variable.
    os.environ.pop("RAY_ADDRESS", None)
    if address == "local":
        # "local", not None: ray.init() without an address joins the cluster RAY_ADDRESS names,
        # or the one `ray start` started on this machine, instead of starting one.
        ray.init(
            address="local",
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            object_store_memory=100_000_000,
            resources={resource: 1},
        )
    else:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    node_id = ray.get_runtime_context().get_node_id()
    return str(node_id), str(ray.util.get_node_ip_address())


async def join(
    ray: Any, address: str, resource: str, log: LogFn, logs_hint: str
) -> tuple[str, str]:
    """Join the cluster at ``address`` (or start a local one for ``"local"``) as the driver;
    this node's id and address. Raises :class:`LocalEvalError` (one line, pointing at the
    run's log) when it cannot."""
    if problem := token_file_problem(os.environ):
        raise LocalEvalError(
            f"could not join the Ray cluster at {address}: {problem}; point it at the file "
            "holding the token the cluster's nodes were started with (or set RAY_AUTH_TOKEN)"
        )
    capture = Fd2Capture()
    started = time.time()
    try:
        with capture:
            with trio.move_on_after(math.inf if address == "local" else JOIN_S):
                return await trio.to_thread.run_sync(
                    partial(_init, ray, address, resource), abandon_on_cancel=True
                )
            # Abandoned: the thread goes on in Ray's loop, and ends with the process.
            raise LocalEvalError(
                f"could not join the Ray cluster at {address}: no Ray cluster answered "
                f"within {JOIN_S:g} s (something listens there: is it the head's GCS port, "
                f"6379 unless `ray start --head --port` said otherwise?)\nLogs: {logs_hint}"
            )
    except LocalEvalError:
        raise
    except Exception as exc:
        cause = failure(exc, distinct_lines(capture.restore()))
        if address == "local" and (
            died := local_start_cause(ray_temp_dir(os.environ), started - 1)
        ):
            cause = f"{cause}: {died}"
        raise LocalEvalError(
            f"could not join the Ray cluster at {address}: {cause}\nLogs: {logs_hint}"
        ) from None
    finally:
        for line, count in distinct_lines(capture.restore()):
            log("WARNING", "cluster", f"ray: {line}", {"times": count} if count > 1 else None)
