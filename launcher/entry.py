"""The ``rollbridge`` console script, safe on the base install.

The base install (``pip install rollbridge``) is what a rollout environment needs and has no
click, rich or LiteLLM, yet pip still installs the console script. Without this shim the
command would die with a ``ModuleNotFoundError`` traceback; with it, it prints one line naming
the extra to install and exits 2. Only a missing package of the ``cli`` extra is translated:
any other import error is a bug and keeps its traceback.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys

__all__ = ["CLI_EXTRA_MODULES", "EXIT_INTERRUPTED", "EXIT_MISSING_EXTRA", "main"]

#: Top-level modules of the ``cli`` extra's packages (pyproject ``[project.optional-dependencies]``).
CLI_EXTRA_MODULES = frozenset(
    {"click", "rich", "litellm", "quart", "quart_trio", "uv", "pycloudflared", "psutil", "dotenv"}
)

#: Exit code when the ``cli`` extra is not installed (a usage problem, as click's usage errors).
EXIT_MISSING_EXTRA = 2

_MESSAGE = (
    "Error: the rollbridge command needs the cli extra ({missing} is not installed): "
    "pip install 'rollbridge[cli]'"
)


#: The exit code of a command interrupted by Ctrl-C (as the CLI's own, 128 + SIGINT).
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> None:
    """Run :func:`launcher.cli.main`, or explain in one line how to get it. A Ctrl-C that
    lands before the CLI has taken over SIGINT (while it is imported) exits 130 quietly, as
    one that lands later does."""
    try:
        _main(argv)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        _exit_now(EXIT_INTERRUPTED)


def _main(argv: list[str] | None) -> None:
    try:
        from launcher.cli import main as cli_main

        # The commands import the rest of the extra only when they run (so that ``--help``
        # stays fast); rich is needed by every one of them, so look for it up front.
        if importlib.util.find_spec("rich") is None:
            raise ModuleNotFoundError("No module named 'rich'", name="rich")
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in CLI_EXTRA_MODULES:
            raise
        sys.stderr.write(_MESSAGE.format(missing=missing) + "\n")
        sys.exit(EXIT_MISSING_EXTRA)
    try:
        cli_main(argv)
    except SystemExit as done:
        _exit_now(done.code)


def _exit_now(code: object) -> None:
    """Exit with ``code`` as ``sys.exit`` would, without the interpreter's teardown.

    The command is over: its files are closed and its children stopped. What is left is
    freeing every object of a process that imported a web stack and held a whole run in
    memory, which took 0.1-0.4 s after the last result of a 1000-row run. ``atexit`` handlers
    still run (temporary directories, ``weakref.finalize``), and the standard streams are
    flushed first.
    """
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        sys.stderr.write(f"{code}\n")
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
            status = status or 1
    os._exit(status)
