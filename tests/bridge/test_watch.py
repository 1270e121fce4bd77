"""The lazy disconnect watch (bridge.watch) in virtual time: which calls are watched, when a
call whose client left is cancelled, and that a call's end always takes its watch down first."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from bridge.watch import WATCH_AFTER, DisconnectWatch


class Client:
    """A stand-in for an ASGI ``receive`` after the request body: it blocks until the client
    goes away (``leave``), then answers ``http.disconnect``; it records what it was asked."""

    def __init__(self) -> None:
        self.gone = trio.Event()
        self.calls = 0
        self.cancelled = 0
        self.active = 0

    async def receive(self) -> Any:
        self.calls += 1
        self.active += 1
        try:
            await self.gone.wait()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        return {"type": "http.disconnect"}


async def test_a_short_call_is_never_watched(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    watch = DisconnectWatch(nursery)
    clients = [Client() for _ in range(20)]
    for client in clients:
        call = watch.begin(client.receive)
        with call.scope:
            await trio.sleep(WATCH_AFTER / 4)
        await watch.end(call)
    await trio.sleep(10 * WATCH_AFTER)
    assert [c.calls for c in clients] == [0] * 20


async def test_a_long_call_whose_client_left_is_cancelled(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    watch = DisconnectWatch(nursery)
    client = Client()
    client.gone.set()
    call = watch.begin(client.receive)
    start = trio.current_time()
    with trio.fail_after(100), call.scope:
        await trio.sleep_forever()
    await watch.end(call)
    assert call.scope.cancelled_caught
    assert WATCH_AFTER <= trio.current_time() - start <= 2 * WATCH_AFTER
    assert client.calls == 1


async def test_a_long_call_with_its_client_still_there_runs_on(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    watch = DisconnectWatch(nursery)
    client = Client()
    call = watch.begin(client.receive)
    with trio.fail_after(100), call.scope:
        await trio.sleep(50 * WATCH_AFTER)
    assert not call.scope.cancelled_caught
    assert client.active == 1  # the watch waits on the client
    await watch.end(call)
    # The end returns once the watch has let go of the connection.
    assert client.active == 0 and client.cancelled == 1


async def test_a_call_that_ends_as_its_watch_starts_leaves_nothing_reading(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    watch = DisconnectWatch(nursery)
    client = Client()
    call = watch.begin(client.receive)
    # Run until the sweeper has started the watch task, but not past its first step.
    while call.done is None:
        await trio.sleep(WATCH_AFTER / 10)
    await watch.end(call)
    assert client.active == 0
    await trio.sleep(10 * WATCH_AFTER)
    assert client.active == 0


async def test_a_receive_that_fails_counts_as_a_client_gone(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    watch = DisconnectWatch(nursery)

    async def broken() -> Any:
        raise OSError("connection reset")

    call = watch.begin(broken)
    with trio.fail_after(100), call.scope:
        await trio.sleep_forever()
    await watch.end(call)
    assert call.scope.cancelled_caught
    # The bridge's nursery carries on: a later call is served and watched as usual.
    client = Client()
    client.gone.set()
    later = watch.begin(client.receive)
    with trio.fail_after(100), later.scope:
        await trio.sleep_forever()
    await watch.end(later)
    assert later.scope.cancelled_caught


async def test_many_calls_each_cancelled_only_when_its_own_client_left(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    watch = DisconnectWatch(nursery)
    clients = [Client() for _ in range(6)]
    outcomes: dict[int, bool] = {}

    async def one(i: int) -> None:
        await trio.sleep(i * WATCH_AFTER / 3)
        call = watch.begin(clients[i].receive)
        with call.scope:
            await trio.sleep(20 * WATCH_AFTER)
        await watch.end(call)
        outcomes[i] = call.scope.cancelled_caught

    with trio.fail_after(100):
        async with trio.open_nursery() as calls:
            for i in range(len(clients)):
                calls.start_soon(one, i)
            await trio.sleep(5 * WATCH_AFTER)
            for client in clients[::2]:
                client.gone.set()
    assert outcomes == {i: i % 2 == 0 for i in range(len(clients))}
    assert all(c.active == 0 for c in clients)
