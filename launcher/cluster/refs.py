"""Awaiting a Ray result from trio without a thread per wait (docs/scale-out.md).

``ref.future()`` is a ``concurrent.futures.Future`` that Ray's core-worker thread completes; its
done-callback only wakes the trio task (thread-safe ``run_sync_soon``) and never calls Ray.
Cancelling the trio side does not cancel the Ray task: cancel through the agent.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

__all__ = ["await_ref"]


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
