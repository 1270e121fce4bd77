"""LiteLLM on one long-lived asyncio loop in one worker thread, driven from trio.

LiteLLM is asyncio-only and slow to import (seconds), so it lives on its own loop thread,
imported there in the background the first time anything needs it. A trio caller submits a
coroutine and sleeps until a trio token wakes it; if the caller is cancelled, the asyncio task
is cancelled too, so the provider request really stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import os
import threading
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any, TypeVar

import trio

T = TypeVar("T")


class LiteLLMWorker:
    """The process's LiteLLM loop thread. Use :func:`worker` to get the shared one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._module: ModuleType | None = None
        self._import_error: BaseException | None = None

    def start(self) -> None:
        """Start the loop thread and begin importing LiteLLM there (idempotent, non-blocking)."""
        with self._lock:
            if self._loop is not None:
                return
            loop = asyncio.new_event_loop()
            self._loop = loop
            thread = threading.Thread(
                target=self._main, args=(loop,), name="rollbridge-litellm", daemon=True
            )
            thread.start()

    def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        # Scheduled first, so every coroutine submitted later runs after the import.
        loop.call_soon(self._import)
        loop.run_forever()

    def _import(self) -> None:
        # Without this LiteLLM fetches a price table from the internet at import.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        # Pydantic complains about LiteLLM's own typed dicts the first time a stream is built;
        # that is noise for our users, not something they can act on.
        warnings.filterwarnings("ignore", message=r".*using the `ReadOnly` qualifier")
        try:
            import litellm

            litellm.suppress_debug_info = True
            self._module = litellm
        except BaseException as exc:  # reported to every caller instead of killing the loop
            self._import_error = exc

    async def _with_module(self, fn: Callable[[ModuleType], Awaitable[T]]) -> T:
        if self._module is None:
            raise RuntimeError(f"LiteLLM could not be imported: {self._import_error!r}")
        return await fn(self._module)

    def _submit(self, fn: Callable[[ModuleType], Awaitable[T]]) -> concurrent.futures.Future[T]:
        self.start()
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._with_module(fn), self._loop)

    async def run(self, fn: Callable[[ModuleType], Awaitable[T]]) -> T:
        """Run ``fn(litellm)`` on the loop and return its result; cancelling cancels it there."""
        future = self._submit(fn)
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    async def call(self, fn: Callable[[ModuleType], T]) -> T:
        """Run a plain function of the ``litellm`` module on the loop thread."""

        async def wrapper(module: ModuleType) -> T:
            return fn(module)

        return await self.run(wrapper)

    async def stream(
        self, fn: Callable[[ModuleType], Awaitable[AsyncIterator[Any]]]
    ) -> AsyncGenerator[Any, None]:
        """Relay the items of the async iterator ``await fn(litellm)`` into trio as they come."""
        send, receive = trio.open_memory_channel[tuple[str, Any]](math.inf)
        token = trio.lowlevel.current_trio_token()

        def deliver(item: tuple[str, Any]) -> None:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                send.send_nowait(item)

        def post(item: tuple[str, Any]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(deliver, item)

        async def pump(module: ModuleType) -> None:
            try:
                iterator = await fn(module)
                async for item in iterator:
                    post(("item", item))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                post(("error", exc))
                return
            post(("end", None))

        future = self._submit(pump)
        try:
            async with receive:
                async for kind, value in receive:
                    if kind == "item":
                        yield value
                    elif kind == "error":
                        raise value
                    else:
                        return
        finally:
            future.cancel()


_WORKER = LiteLLMWorker()


def worker() -> LiteLLMWorker:
    """The shared LiteLLM worker (one loop thread per process)."""
    return _WORKER
