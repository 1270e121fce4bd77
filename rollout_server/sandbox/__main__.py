"""``python -m rollout_server.sandbox agent|grade``: one step of a workflow-mode trial."""

from __future__ import annotations

import sys

import trio

from .runner import run_agent, run_grade

_USAGE = "usage: python -m rollout_server.sandbox agent|grade"


def main(argv: list[str]) -> int:
    """Run the named step; its exit code is 0 when it succeeded (its result file says why not)."""
    if len(argv) != 1 or argv[0] not in ("agent", "grade"):
        print(_USAGE, file=sys.stderr)
        return 2
    step = run_agent if argv[0] == "agent" else run_grade
    return trio.run(step)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
