"""Reading a run's ``logs.txt`` in bounded pieces: whole lines in blocks of about
:data:`BLOCK` bytes, and the lines that name a string, found at the speed of ``bytes.find``.

A run's log only grows, and can grow to hundreds of megabytes; the daemon reads it for every
view of a run and of an item. Neither reader here holds more than a block (plus one line) of
it, whatever its size (docs/daemon.md, "Reading logs.txt").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["BLOCK", "MAX_LINE", "lines_naming", "whole_lines"]

#: How much of the file is read at a time.
BLOCK = 1 << 20
#: A line longer than this is passed over. logs.txt's writer cuts its lines at 64 KiB
#: (launcher.rundir.logs.MAX_LINE_BYTES), so only a file written otherwise has one.
MAX_LINE = 1 << 20


def whole_lines(fh: BinaryIO, start: int, end: int) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines of ``fh`` between ``start`` and ``end``, each with the position
    just past it; a block is empty or ends with a newline. What follows the last newline
    before ``end`` (a line still being written) is not yielded; a line over
    :data:`MAX_LINE` is left out (an empty block then marks the position past it)."""
    fh.seek(start)
    pos, carry, skipping = start, b"", False
    while pos < end:
        piece = fh.read(min(BLOCK, end - pos))
        if not piece:
            return
        pos += len(piece)
        if skipping:
            newline = piece.find(b"\n")
            if newline < 0:
                continue
            piece, skipping = piece[newline + 1 :], False
            yield b"", pos - len(piece)
        data = carry + piece if carry else piece
        del piece  # at most two copies of a block alive at once
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        block = data if cut == len(data) else data[:cut]
        del data
        if cut:
            yield block, pos - len(carry)
        del block
        if len(carry) > MAX_LINE:
            carry, skipping = b"", True


def lines_naming(path: Path, needle: str, *, unless: str | None = None) -> list[str]:
    """The lines of ``path`` that contain ``needle`` (and not ``unless``), in order, without
    their newlines; ``[]`` when the file cannot be read."""
    want = needle.encode()
    skip = unless.encode() if unless is not None else None
    found: list[str] = []
    if not want:
        return found
    try:
        with path.open("rb") as fh:
            end = fh.seek(0, 2)
            tail_start = 0
            for block, after in whole_lines(fh, 0, end):
                found += _naming(block, want, skip)
                tail_start = after
                del block  # freed before the next block is read
            fh.seek(tail_start)
            tail = fh.read(min(MAX_LINE + 1, end - tail_start))
    except OSError:
        return found
    if tail and len(tail) <= MAX_LINE:  # the last line, without its newline yet
        found += _naming(tail, want, skip)
    return found


def _naming(block: bytes, want: bytes, skip: bytes | None) -> list[str]:
    lines = []
    at = block.find(want)
    while at >= 0:
        start = block.rfind(b"\n", 0, at) + 1
        stop = block.find(b"\n", at)
        stop = len(block) if stop < 0 else stop
        line = block[start:stop].removesuffix(b"\r")
        if skip is None or skip not in line:
            lines.append(line.decode("utf-8", "replace"))
        at = block.find(want, stop)
    return lines
