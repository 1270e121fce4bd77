"""A long-lived Harbor worker: Harbor imported once, one forked process per trial.

Usage: ``<harbor's python> .../rollout_server/harbor/_forkserver.py <owner pid> <grace s>`` (run
by path with the interpreter of Harbor's environment; it imports nothing of the project).

Importing Harbor's CLI costs seconds of CPU, and ``harbor trial start`` paid it in every trial.
This server imports it once, then forks a child per trial that runs ``harbor <argv>`` exactly as
the CLI would, so each trial is still a process of its own: its own session (the backend cancels
it with SIGINT to its group, SIGKILL after the grace), its own log file on stdout and stderr,
its own environment; a crash takes down one trial, never the server or the other trials.

Before serving, it also does what every trial would repeat (``_warm``; ``ROLLBRIDGE_HARBOR_WARM=0``
turns that off): builds the CLI's click command, resolves Harbor's podman runtime and asks podman
for its daemon's OS once (a ``podman info`` per trial otherwise, half a second here).

Protocol, one JSON document per line. The server writes ``{"ready": true}`` once imported.
The owner writes ``{"id", "argv", "env", "cwd", "log"}``; the server answers
``{"id", "pid"}`` once the child runs (or ``{"id", "error"}``) and ``{"id", "exit"}`` when it
ends (the exit code, or minus the signal that killed it).

The owner's death: its end of stdin closes (or the server's parent changes); the server then
SIGINTs every live trial's group, SIGKILLs what remains after the grace, and exits. A trial whose
server dies gets SIGINT from the kernel (``PR_SET_PDEATHSIG``; the server is single-threaded, so
the signal means the server's death). Containers that survive all this are reaped by label at
the next rollout server's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import select
import signal
import sys
import time
import traceback
from typing import Any

_POLL_S = 0.2
_PRELOAD = (
    "harbor.cli.main",
    "harbor.trial.trial",
    "harbor.models.trial.result",
    "harbor.environments.factory",
    "harbor.agents.factory",
)
#: Imported by every trial on its way, after the CLI's own imports (``_warm``).
_PRELOAD_MORE = (
    "harbor.environments.docker.docker",
    "harbor.environments.podman",
    "harbor.trial.single_step",
    "dirhash",
)
_PR_SET_PDEATHSIG = 1


#: The pipe to the owner, moved off fd 1 at start so that nothing Harbor prints reaches it.
_OUT = 1
#: Harbor's CLI as a click command, built once here (typer builds it on every call otherwise).
_COMMAND: Any = None


def _warm() -> None:
    """Work every trial's Harbor process would repeat, done once before forking: the rest of
    its imports, the CLI's command, the podman runtime (Harbor caches it per process) and the
    podman daemon's OS (Harbor asks in every environment start; it cannot change meanwhile)."""
    global _COMMAND
    for module in _PRELOAD_MORE:
        with contextlib.suppress(Exception):
            __import__(module)
    with contextlib.suppress(Exception):
        app = importlib.import_module("harbor.cli.main").app
        _COMMAND = importlib.import_module("typer.main").get_command(app)
    with contextlib.suppress(Exception):
        docker = importlib.import_module("harbor.environments.docker.docker").DockerEnvironment
        podman = importlib.import_module("harbor.environments.podman").PodmanEnvironment
        podman.runtime()
        detect = docker.__dict__.get("_detect_daemon_os")
        if isinstance(detect, classmethod):
            podman_os = detect.__func__(podman)

            def daemon_os(cls: type) -> object:
                if issubclass(cls, podman):
                    return podman_os
                return detect.__func__(cls)

            docker._detect_daemon_os = classmethod(daemon_os)


def _send(document: dict[str, object]) -> None:
    os.write(_OUT, (json.dumps(document) + "\n").encode())


def _child(request: dict[str, object]) -> None:
    """In the forked child: become the trial's process and run Harbor's CLI; never returns."""
    code = 1
    try:
        os.setsid()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGINT)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # fds 0 and 1 are replaced above; the owner's pipe (_OUT) is not the trial's.
        for fd in (log, null, _OUT):
            with contextlib.suppress(OSError):
                os.close(fd)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        # PYTHONPATH is read at interpreter start only; the trial's (an agent's import path)
        # must reach this already-running interpreter's sys.path.
        for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        random.seed()
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = ["harbor", *(str(a) for a in argv)]
        app: Any = _COMMAND or importlib.import_module("harbor.cli.main").app
        try:
            app(prog_name="harbor")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except KeyboardInterrupt:
            code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _stop_all(children: dict[int, object], grace: float) -> None:
    for pid in children:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while children and time.monotonic() < deadline:
        _reap(children, report=False)
        time.sleep(_POLL_S)
    for pid in children:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _reap(children: dict[int, object], *, report: bool = True) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = children.pop(pid, None)
        if ident is not None and report:
            code = os.waitstatus_to_exitcode(status)
            _send({"id": ident, "exit": code})


def main(argv: list[str]) -> int:
    """Serve trial requests on stdin until the owner goes away."""
    global _OUT
    owner, grace = int(argv[0]), float(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _OUT = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    for module in _PRELOAD:
        with contextlib.suppress(Exception):
            __import__(module)
    if os.environ.get("ROLLBRIDGE_HARBOR_WARM", "1") != "0":
        _warm()
    sys.stdout.flush()
    sys.stderr.flush()
    _send({"ready": True})
    children: dict[int, object] = {}
    pending = b""
    while True:
        _reap(children)
        if os.getppid() != owner:
            break
        readable, _, _ = select.select([0], [], [], _POLL_S)
        if not readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                request = json.loads(line)
                ident = request["id"]
            except (ValueError, KeyError, TypeError):
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                _send({"id": ident, "error": str(exc)})
                continue
            if pid == 0:
                _child(request)
            children[pid] = ident
            _send({"id": ident, "pid": pid})
    _stop_all(children, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
