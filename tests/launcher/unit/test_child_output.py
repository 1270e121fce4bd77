"""A child's output reaches its sink a line at a time (launcher.process): a line of many MB, or
one that never ends, is handed on as its first and last pieces with a line between saying how
much was left out, so neither memory nor logs.txt grow with it."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from launcher.process import LINE_PIECE, spawn_child

SCRIPT = """
import sys
out = sys.stdout.buffer
out.write(b"first\\nA" + b"x" * (8 * 1024 * 1024) + b"Z\\n")
out.flush()
out.write(b"tail line\\n" + b"y" * (3 * 1024 * 1024))  # the last line has no end
"""


async def test_a_huge_line_is_handed_on_as_its_head_and_tail(tmp_path: Path) -> None:
    lines: list[str] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            child = await spawn_child(
                nursery,
                [sys.executable, "-c", SCRIPT],
                cwd=tmp_path,
                env={"PATH": "/usr/bin:/bin"},
                sink=lines.append,
                name="big",
            )
            await child.process.wait()
            assert child.output_done is not None
            await child.output_done.wait()
    first, head, note, tail, small, head2, note2, tail2 = lines
    assert (first, small) == ("first", "tail line")
    assert head == "A" + "x" * (LINE_PIECE - 1) and tail == "x" * (LINE_PIECE - 1) + "Z"
    assert note == f"[… {8 * 1024 * 1024 + 2 - 2 * LINE_PIECE:,} bytes of this line not logged …]"
    assert head2 == tail2 == "y" * LINE_PIECE
    assert note2 == f"[… {3 * 1024 * 1024 - 2 * LINE_PIECE:,} bytes of this line not logged …]"
    assert len(child.last_line) == 4096 and len(child.tail[-1]) == 4096
