"""Awaiting a Ray result from trio without a thread per wait (docs/scale-out.md).

``ref.future()`` is a ``concurrent.futures.Future`` that Ray's core-worker thread completes; its
done-callback only wakes the trio task (thread-safe ``run_sync_soon``) and never calls Ray.
Cancelling the trio side does not cancel the Ray task: cancel through the agent.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import trio

__all__ = ["await_ref", "ray_cause"]

# A CSI escape sequence (Ray colours a task error's traceback with them).
_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


async def await_ref(ref: Any) -> Any:
    """The value of the Ray ``ObjectRef`` ``ref``; raises what Ray raises for it."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = ref.future()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


def ray_cause(exc: BaseException, limit: int = 300) -> str:
    """``exc`` as one printable line for a log's cause: Ray's messages span several lines, and
    a task error's traceback carries ANSI colours. A long one keeps its start and its end (the
    exception that ended the traceback)."""
    text = " ".join(_CSI.sub("", f"{type(exc).__name__}: {exc}").split())
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]} … {text[-half:]}"
