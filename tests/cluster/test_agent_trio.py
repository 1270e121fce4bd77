"""The node agent's trio beside Ray's asyncio loop (``launcher.cluster.agent._Trio``), without
Ray: an asyncio loop stands in for the actor's."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from launcher.cluster.agent import _Trio


async def _double(value: int) -> tuple[int, str]:
    await trio.lowlevel.checkpoint()
    return value * 2, threading.current_thread().name


async def _fail() -> None:
    await trio.lowlevel.checkpoint()
    raise ValueError("the item failed")


@pytest.mark.parametrize("guest", [False, True], ids=["thread", "guest"])
def test_calls_run_in_trio_and_answer_on_the_loop(guest: bool) -> None:
    async def scenario() -> None:
        runner = _Trio()
        await runner.start(guest)
        loop_thread = threading.current_thread().name
        answers = await asyncio.gather(*(runner.call(_double, n) for n in range(20)))
        assert [value for value, _ in answers] == [n * 2 for n in range(20)]
        where = {name for _, name in answers}
        # On a thread of its own unless in guest mode (then the loop's own thread).
        assert where == ({loop_thread} if guest else {"rollbridge-agent-trio"})
        with pytest.raises(ValueError, match="the item failed"):
            await runner.call(_fail)
        assert (await runner.call(_double, 4))[0] == 8  # the run goes on after a failure
        runner.stop()
        while not runner.finished.is_set():
            await asyncio.sleep(0.01)
        for _ in range(500):  # a thread's run ended: the thread itself ends right after
            if not any(t.name == "rollbridge-agent-trio" for t in threading.enumerate()):
                break
            await asyncio.sleep(0.01)
        assert not any(t.name == "rollbridge-agent-trio" for t in threading.enumerate())

    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout=30)

    asyncio.run(bounded())
