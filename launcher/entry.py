"""The ``rollbridge`` console script, safe on the base install.

The base install (``pip install rollbridge``) is what a rollout environment needs and has no
click, rich or LiteLLM, yet pip still installs the console script. Without this shim the
command would die with a ``ModuleNotFoundError`` traceback; with it, it prints one line naming
the extra to install and exits 2. Only a missing package of the ``cli`` extra is translated:
any other import error is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

__all__ = ["CLI_EXTRA_MODULES", "EXIT_MISSING_EXTRA", "main"]

#: Top-level modules of the ``cli`` extra's packages (pyproject ``[project.optional-dependencies]``).
CLI_EXTRA_MODULES = frozenset(
    {"click", "rich", "litellm", "quart", "quart_trio", "uv", "pycloudflared", "psutil"}
)

#: Exit code when the ``cli`` extra is not installed (a usage problem, as click's usage errors).
EXIT_MISSING_EXTRA = 2

_MESSAGE = (
    "Error: the rollbridge command needs the cli extra ({missing} is not installed): "
    "pip install 'rollbridge[cli]'"
)


def main(argv: list[str] | None = None) -> None:
    """Run :func:`launcher.cli.main`, or explain in one line how to get it."""
    try:
        from launcher.cli import main as cli_main
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in CLI_EXTRA_MODULES:
            raise
        sys.stderr.write(_MESSAGE.format(missing=missing) + "\n")
        sys.exit(EXIT_MISSING_EXTRA)
    cli_main(argv)
