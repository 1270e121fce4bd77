"""A ``podman-compose`` front for Harbor's trials: ``exec`` straight to ``podman exec``.

Usage: installed by the backend as ``podman-compose`` first on the Harbor process's PATH (a copy
of this file with :data:`REAL` filled in); stdlib only, run with ``python -I``.

podman 4.3 has no ``compose``, so Harbor drives every container command through podman-compose,
a Python program that parses every compose file again on each call: most of a second of CPU per
``exec`` on a busy 2-core machine, and a trial makes a dozen. For the one shape Harbor's
``exec`` has (``[--in-pod=...] --project-name P -f F... exec [-w D] [-e K=V]... [-u U] [-T]
[--privileged] SERVICE CMD...``) this runs what podman-compose would run,
``podman exec --interactive [--privileged] [--user U] [--workdir D] [--tty] [--env K=V]...
P_SERVICE_1 CMD...`` (podman-compose's own argument order; the service's compose ``environment``
is already the container's), once ``podman container inspect P_SERVICE_1`` says it runs. ``cp``,
which podman-compose does not have: an upload (``cp HOST_PATH SERVICE:PATH``) becomes
``podman cp HOST_PATH P_SERVICE_1:PATH``, what ``docker compose cp`` does and what Harbor uses
wherever compose has ``cp`` (``ROLLBRIDGE_HARBOR_FAST_CP=0`` turns that off); any other ``cp``
fails at once as podman-compose's would, and Harbor then streams a tar through two ``exec``s.

When the rollout server has taken a trial's teardown over (``ROLLBRIDGE_HARBOR_DEFER_DOWN`` is
its pid, see ``teardown.py``), two ``down`` calls are answered here too. The trial's final
``down --rmi local --volumes --remove-orphans`` succeeds at once while that server lives: it
removes the project's containers, networks, images and volumes itself after the trial (once it
is dead, as when the watchdog stops a trial whose server was killed, the real ``down`` runs). Harbor's
``down --remove-orphans`` before ``up`` has nothing to remove in a fresh trial (the server swept
the trial by label just before): when no container carries the project's compose label, it
succeeds at once. Anything else goes to the real podman-compose with the same arguments.

Two things the trial cannot tell otherwise are written, as small JSON files, into the directory
``ROLLBRIDGE_HARBOR_REPORTS`` names (the trial's staging dir; see ``trialreport.py``):

* ``container-exit.json``: an ``exec`` found its container not running (exited, or created and
  never started: a task whose ENTRYPOINT exits, or cannot be run). Harbor polls ``exec true``
  for 90 s before it gives up on such a container, whatever each attempt answers; the backend
  watches for this file and stops the trial within a second or two. The file holds the state,
  the exit code and the tail of the container's log (``podman logs --tail``), read once. A
  project Harbor itself stopped (``stop``, ``down``, ``kill``: a separate verifier's trial stops
  its main service before its last ``exec`` into it) is not reported: each such call leaves a
  ``stopped-<project>`` mark first.
* ``verifier-exit.json``: the verifier's run (``(TEST) > /logs/verifier/test-stdout.txt 2>&1``)
  is started as a child and waited for (its signals forwarded), since Harbor discards its exit
  code; the file holds that code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys

#: The real podman-compose (filled in when the backend installs this file).
REAL = ""
_PROJECT_LABEL = "io.podman.compose.project"
_FINAL_DOWN = {"--rmi", "local", "--volumes", "--remove-orphans"}
_REPORTS_ENV = "ROLLBRIDGE_HARBOR_REPORTS"
#: States of a container that will not run an ``exec`` again: it ended, or ``up`` created it
#: and could not start it (podman-compose's ``up`` does not fail for that).
_GONE = frozenset({"exited", "stopped", "created", "configured", "dead"})
#: Harbor's verifier command (harbor 0.25 ``utils/scripts.py`` ``build_execution_command``).
_VERIFIER_RUN = re.compile(r"\) > '?/logs/verifier/test-stdout\.txt'? 2>&1$")
_LOG_LINES = 20
_LOG_BYTES = 2048


def _globals(args: list[str]) -> tuple[str | None, int]:
    """The project name and the index of the subcommand, past the global options Harbor gives
    (an unknown option stops the scan there: that call is not one this shim knows)."""
    project = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--in-pod="):
            i += 1
        elif arg in ("--project-name", "-p", "-f", "--file") and i + 1 < len(args):
            if arg in ("--project-name", "-p"):
                project = args[i + 1]
            i += 2
        else:
            break
    return project, i


def _exec_argv(args: list[str]) -> tuple[list[str], str] | None:
    """``podman exec`` argv for a plain Harbor ``exec`` and its container, or None for
    anything else."""
    project, i = _globals(args)
    if project is None or i >= len(args) or args[i] != "exec":
        return None
    i += 1
    user = workdir = None
    tty, privileged = True, False
    env: list[str] = []
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if arg in ("-w", "--workdir", "-e", "--env", "-u", "--user") and i + 1 < len(args):
            value = args[i + 1]
            if arg in ("-w", "--workdir"):
                workdir = value
            elif arg in ("-u", "--user"):
                user = value
            else:
                env.append(value)
            i += 2
        elif arg == "-T":
            tty = False
            i += 1
        elif arg == "--privileged":
            privileged = True
            i += 1
        else:
            return None
    if i + 1 >= len(args):
        return None
    service, command = args[i], args[i + 1 :]
    argv = ["podman", "exec", "--interactive"]
    if privileged:
        argv.append("--privileged")
    if user:
        argv += ["--user", user]
    if workdir:
        argv += ["--workdir", workdir]
    if tty:
        argv.append("--tty")
    argv += [f"--env={e}" for e in env]
    container = f"{project}_{service}_1"
    return [*argv, container, *command], container


def _down_done_here(args: list[str]) -> bool:
    """Whether ``args`` is a ``down`` this shim answers itself (see the module docstring)."""
    project, at = _globals(args)
    if project is None or args[at : at + 1] != ["down"]:
        return False
    owner = os.environ.get("ROLLBRIDGE_HARBOR_DEFER_DOWN", "")
    if not owner.isdigit():
        return False
    options = args[at + 1 :]
    if len(options) == len(_FINAL_DOWN) and set(options) == _FINAL_DOWN:
        # Handed over only while the server that takes it lives: a trial stopped because its
        # server died (the watchdog's SIGINT) tears its own containers down.
        return _alive(int(owner))
    if options == ["--remove-orphans"]:
        listed = _podman_output(["ps", "-a", "-q", "--filter", f"label={_PROJECT_LABEL}={project}"])
        return listed is not None and not listed.strip()
    return False


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not). The rule
    of :mod:`.containers`' owner check, restated: this file runs alone (``python -I``, a copy
    outside the package) and can import nothing of the project."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[:1]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ([b"Z"], [b"X"])


def _cp_argv(args: list[str]) -> tuple[list[str], str] | None:
    """``podman cp`` argv for an upload (``cp HOST_PATH SERVICE:PATH``) and its container, or
    None for any other ``cp``."""
    project, at = _globals(args)
    rest = args[at + 1 :]
    if project is None or args[at : at + 1] != ["cp"] or len(rest) != 2:
        return None
    source, target = rest
    service, colon, path = target.partition(":")
    if not colon or not service or not path.startswith("/") or not os.path.isabs(source):
        return None
    if service.strip("abcdefghijklmnopqrstuvwxyz0123456789_-."):
        return None
    container = f"{project}_{service}_1"
    return ["podman", "cp", source, f"{container}:{path}"], container


def main(args: list[str]) -> int:
    """Run ``args`` as podman-compose would."""
    project, at = _globals(args)
    if args[at : at + 1] == ["cp"]:
        upload = _cp_argv(args) if os.environ.get("ROLLBRIDGE_HARBOR_FAST_CP") != "0" else None
        if upload is not None and _container_exists(upload[1]):
            os.execvp(upload[0][0], upload[0])
        sys.stderr.write("podman-compose: error: argument command: invalid choice: 'cp'\n")
        return 2
    if project is not None and args[at : at + 1] in (["stop"], ["down"], ["kill"], ["rm"]):
        # Stopped on purpose: an exec into it afterwards is no sign the task is broken.
        _write_report(f"stopped-{project}", {"command": args[at]})
    elif project is not None and args[at : at + 1] == ["up"]:
        _clear_report(f"stopped-{project}")  # Harbor's `down` before every `up` marked it
    if _down_done_here(args):
        return 0
    fast = _exec_argv(args)
    state = _container_state(fast[1]) if fast is not None else None
    if fast is not None and state is not None:
        argv, container = fast
        if state[0] in _GONE:
            _report_gone(str(project), container, *state)
            sys.stderr.write(
                f"podman-compose: container {container} is not running ({state[0]}, exit code "
                f"{state[1]})\n"
            )
            return 125
        if _VERIFIER_RUN.search(argv[-1]):
            return _run_verifier(argv, container)
        os.execvp(argv[0], argv)
    os.execv(REAL, [REAL, *args])
    return 1  # not reached


def _write_report(name: str, document: dict[str, object]) -> None:
    """Write ``document`` as ``name`` in the reports dir, whole or not at all (the backend may
    read it at any moment); nothing when the backend asked for no reports, or when the dir is
    gone: the trial's staging dir has been removed (a Harbor process outliving its server,
    say), and making it again would leave a scratch dir nobody owns."""
    directory = os.environ.get(_REPORTS_ENV, "")
    if not directory or not os.path.isdir(directory):
        return
    try:
        temp = os.path.join(directory, f".{name}.{os.getpid()}")
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(document, handle)
        os.replace(temp, os.path.join(directory, name))
    except OSError:
        pass  # the trial then ends as Harbor ends it: only slower, or with less said


def _clear_report(name: str) -> None:
    directory = os.environ.get(_REPORTS_ENV, "")
    if directory:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))


def _report_gone(project: str, container: str, status: str, exit_code: int) -> None:
    """Report a container that will not run an ``exec`` (once: the first look wins), unless
    its project was stopped on purpose."""
    directory = os.environ.get(_REPORTS_ENV, "")
    if not directory or any(
        os.path.exists(os.path.join(directory, name))
        for name in ("container-exit.json", f"stopped-{project}")
    ):
        return
    log = _podman_output(["logs", "--tail", str(_LOG_LINES), container], stderr=True) or b""
    _write_report(
        "container-exit.json",
        {
            "container": container,
            "status": status,
            "exit_code": exit_code,
            "log": log[-_LOG_BYTES:].decode("utf-8", "replace"),
        },
    )


def _run_verifier(argv: list[str], container: str) -> int:
    """Run the verifier's ``podman exec`` as a child, report its exit code, return it."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)

    def forward(signum: int, _frame: object) -> None:
        # Harbor stops a command it gave up on with SIGTERM (SIGKILL 5 s later); the exec
        # must get it, as it would have without this parent.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    code = _exit_code(pid)
    _write_report("verifier-exit.json", {"container": container, "exit_code": code})
    return code if code >= 0 else 128 - code


def _spawn_podman(args: list[str], out: int | None, *, stderr: bool = False) -> int:
    """Start ``podman <args>`` (stdin on /dev/null, stdout to ``out`` or /dev/null, stderr to
    /dev/null, or to ``out`` too with ``stderr``); its pid."""
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(out if out is not None else null, 1)
        os.dup2(out if stderr and out is not None else null, 2)
        try:
            os.execvp("podman", ["podman", *args])
        finally:
            os._exit(127)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _podman_output(args: list[str], *, stderr: bool = False) -> bytes | None:
    """``podman <args>``'s output (with its stderr too, with ``stderr``), or None when it
    failed."""
    read, write = os.pipe()
    try:
        pid = _spawn_podman(args, write, stderr=stderr)
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        output = pipe.read()
    return output if _exit_code(pid) == 0 else None


def _container_exists(name: str) -> bool:
    """Whether podman knows ``name`` (else podman-compose resolves the container itself)."""
    return _exit_code(_spawn_podman(["container", "exists", name], None)) == 0


def _container_state(name: str) -> tuple[str, int] | None:
    """The state and exit code of container ``name``, or None when podman does not know it
    (podman-compose then resolves the container itself). One podman call, as cheap as
    ``container exists``."""
    template = "{{.State.Status}} {{.State.ExitCode}}"
    output = _podman_output(["container", "inspect", "--format", template, name])
    status, _, code = (output or b"").decode("utf-8", "replace").strip().partition(" ")
    if not status:
        return None
    try:
        return status.lower(), int(code)
    except ValueError:
        return status.lower(), -1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
