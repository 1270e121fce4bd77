"""Running the judge calls: records × judges × runs, at most eight at a time (spec Part D.5).

Verdicts are collected by ``(record, judge, run)`` so that the report lists each record's
runs in run order whatever order they finished in. A verdict already known (``eval rubric
--run`` keeps them in the run directory) is never asked for again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import trio

from bridge.usage import CallUsage
from launcher.rubric.inputs import JudgeRecord
from launcher.rubric.judge import Judge, Verdict, total_usage
from launcher.rubric.prompt import build_messages

__all__ = ["CONCURRENCY", "RANGE_ERROR", "Evaluation", "TaskKey"]

#: Judge calls in flight at once, as in the reference tool.
CONCURRENCY = 8
RANGE_ERROR = "'score_max' must be greater than 'score_min'"

TaskKey = tuple[int, int, int]
"""``(record position, judge position, run)``, all 0-based."""

OnVerdict = Callable[[TaskKey, Verdict], Awaitable[None]]


@dataclass
class Evaluation:
    """Everything one ``eval rubric`` invocation judges, and the verdicts so far."""

    rubric: str
    records: Sequence[JudgeRecord]
    judges: Sequence[Judge]
    number: int
    score_min: float
    score_max: float
    verdicts: dict[TaskKey, Verdict] = field(default_factory=dict)
    fresh: set[TaskKey] = field(default_factory=set)
    """Keys judged by this invocation (the others were loaded)."""

    def keys(self) -> Iterator[TaskKey]:
        """Every task, record-major, then judge, then run."""
        for r in range(len(self.records)):
            for j in range(len(self.judges)):
                for k in range(self.number):
                    yield (r, j, k)

    def pending(self) -> list[TaskKey]:
        """Tasks without a score yet (a stored error is judged again)."""
        return [
            key
            for key in self.keys()
            if key not in self.verdicts or self.verdicts[key].score is None
        ]

    def usage(self, judge: int) -> CallUsage:
        """The tokens judge ``judge`` used in this invocation."""
        return total_usage(
            v.usage for key, v in self.verdicts.items() if key[1] == judge and key in self.fresh
        )

    async def run(self, tasks: Sequence[TaskKey], on_verdict: OnVerdict | None = None) -> None:
        """Judge ``tasks`` with :data:`CONCURRENCY` workers; ``on_verdict`` sees each result as
        it arrives (before the next task of that worker starts)."""
        queue = iter(tasks)

        async def worker() -> None:
            for key in queue:
                verdict = await self._judge(key)
                self.verdicts[key] = verdict
                self.fresh.add(key)
                if on_verdict is not None:
                    await on_verdict(key, verdict)

        async with trio.open_nursery() as nursery:
            for _ in range(min(CONCURRENCY, len(tasks))):
                nursery.start_soon(worker)

    async def _judge(self, key: TaskKey) -> Verdict:
        if self.score_max <= self.score_min:
            await trio.lowlevel.checkpoint()
            return Verdict.failed(RANGE_ERROR)
        record, judge, _ = key
        messages = build_messages(self.records[record], self.rubric, self.score_min, self.score_max)
        return await self.judges[judge].judge(messages, self.score_min, self.score_max)
