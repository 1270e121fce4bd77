"""Reading a run's ``logs.txt`` in bounded pieces: whole lines in blocks of about
:data:`BLOCK` bytes; folds over them that go on, at the next read, from where the last one
stopped (:class:`LineFold`); the lines that name a string, found at the speed of
``bytes.find``; and the last lines, read backwards from the end (:func:`last_lines`).

A run's log only grows, and can grow to hundreds of megabytes; the daemon reads it for every
view of a run and of an item, for the live usage and for a tail. No reader here holds more than
a block of it (plus one line, or the lines asked for), whatever its size. The kept folds, and a
tail's count of the lines before its own, read only what was added since their last read, and
a tail's lines come from the end (docs/daemon.md, "Reading logs.txt").
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Generic, TypeVar

__all__ = [
    "BLOCK",
    "MAX_LINE",
    "TAIL_BLOCK",
    "LineFold",
    "Place",
    "Places",
    "last_lines",
    "lines_naming",
    "whole_lines",
]

#: How much of the file is read at a time.
BLOCK = 1 << 20
#: A line longer than this is passed over. logs.txt's writer cuts its lines at 64 KiB
#: (launcher.rundir.logs.MAX_LINE_BYTES), so only a file written otherwise has one.
MAX_LINE = 1 << 20
#: How much of the file's end one step of :func:`last_lines` reads (most tails take one).
TAIL_BLOCK = 64 * 1024
#: How many bytes before a kept position must still be there for a fold to go on from it.
MARK = 64

S = TypeVar("S")


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


@dataclass(frozen=True)
class Place(Generic[S]):
    """A fold's ``state`` over a file up to ``position``, with the file's identity and
    ``mark``, the bytes just before that position: a file rewritten in place (same inode, a
    copy over it) no longer has them there, and is folded again."""

    device: int
    inode: int
    position: int
    state: S
    mark: bytes = b""

    @classmethod
    def at(cls, fd: int, info: os.stat_result, position: int, floor: int, state: S) -> Place[S]:
        """The place ``position`` of the file open as ``fd`` (its mark taken from no earlier
        than ``floor``, where the fold began)."""
        size = min(MARK, max(0, position - floor))
        mark = os.pread(fd, size, position - size)
        return cls(info.st_dev, info.st_ino, position, state, mark)

    def continues(self, fd: int, info: os.stat_result) -> bool:
        """Whether the file open as ``fd`` is this one, grown or as it was."""
        if (self.device, self.inode) != (info.st_dev, info.st_ino):
            return False
        if self.position > info.st_size:
            return False
        return os.pread(fd, len(self.mark), self.position - len(self.mark)) == self.mark


class Places(Generic[S]):
    """Folds' places per key (the ``limit`` used last), shared by the daemon's worker threads
    (run views, tails and usage are read in them)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._places: OrderedDict[Hashable, Place[S]] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, key: Hashable, fd: int, info: os.stat_result) -> Place[S] | None:
        """The place kept for ``key`` if the file open as ``fd`` continues it, else None."""
        with self._lock:
            place = self._places.get(key)
        return place if place is not None and place.continues(fd, info) else None

    def keep(self, key: Hashable, place: Place[S]) -> None:
        """Keep ``place`` unless a read in another thread kept a later one of the same file."""
        with self._lock:
            kept = self._places.get(key)
            same_file = kept is not None and (kept.device, kept.inode) == (
                place.device,
                place.inode,
            )
            if not same_file or kept is None or kept.position < place.position:
                self._places[key] = place
            self._places.move_to_end(key)
            while len(self._places) > self._limit:
                self._places.popitem(last=False)


class LineFold(Generic[S]):
    """A fold over a file's whole lines from a start position, kept per file and start so that
    the next call folds only the lines added since (a call on an ended run's log reads a few
    bytes); a file replaced (another inode), shorter than the place kept, or rewritten in place
    is folded again from ``start``.

    ``step(state, block)`` folds a block of whole lines (or the line still being written,
    without its newline) into ``state`` in place, ``copy`` copies a state and ``fresh`` makes
    an empty one. A state once kept is never changed again: what a call returns may be the
    kept state itself, and must not be changed either.
    """

    def __init__(
        self,
        fresh: Callable[[], S],
        step: Callable[[S, bytes], None],
        copy: Callable[[S], S],
        *,
        kept: int,
    ) -> None:
        self._fresh = fresh
        self._step = step
        self._copy = copy
        self._places: Places[S] = Places(kept)

    def __call__(self, path: Path, start: int) -> S:
        """The fold of ``path``'s lines from ``start``, with the line still being written (no
        newline yet), which counts for this call only; a fresh state when it cannot be read."""
        key = (str(path), start)
        try:
            with path.open("rb") as fh:
                fd = fh.fileno()
                info = os.fstat(fd)
                kept = self._places.find(key, fd, info)
                state = self._fresh() if kept is None else kept.state
                owned = kept is None  # a kept state is copied before it is changed
                position = start if kept is None else kept.position
                for block, after in whole_lines(fh, position, info.st_size):
                    if not owned:
                        state, owned = self._copy(state), True
                    self._step(state, block)
                    position = after
                    del block  # freed before the next block is read
                place = Place.at(fd, info, position, start, state)
                fh.seek(position)
                tail = fh.read(min(MAX_LINE + 1, max(0, info.st_size - position)))
        except OSError:
            return self._fresh()
        self._places.keep(key, place)
        if tail and len(tail) <= MAX_LINE:
            state = self._copy(state)
            self._step(state, tail)
        return state


#: Per file, how many line breaks it has up to a place and its byte before that place.
_breaks_kept: Places[tuple[int, bytes]] = Places(256)


def last_lines(path: Path, count: int) -> tuple[int, list[bytes]]:
    """The last ``count`` lines of ``path`` and how many lines come before them; lines as
    ``bytes.splitlines`` splits the whole file (at ``\\n``, ``\\r\\n`` and ``\\r``), the last
    one even without its line break yet. Raises ``OSError`` when the file cannot be read.

    The lines are read backwards from the end, :data:`TAIL_BLOCK` bytes at a time, until
    ``count`` whole ones are there or the start is reached (a line longer than that takes more
    steps). How many lines come before them is a count of the file's line breaks kept per file,
    as a :class:`LineFold` is: the first call on a file reads it once in blocks, at the speed of
    ``bytes.count``; a later call reads only the bytes added since, and the end.
    """
    with path.open("rb") as fh:
        fd = fh.fileno()
        info = os.fstat(fd)
        total = _line_count(str(path), fh, info)
        lines = _last(fd, info.st_size, count) if count > 0 else []
    return total - len(lines), lines


def _line_count(key: str, fh: BinaryIO, info: os.stat_result) -> int:
    """How many lines the file open as ``fh`` has in its first ``info.st_size`` bytes."""
    fd = fh.fileno()
    kept = _breaks_kept.find(key, fd, info)
    breaks, last = kept.state if kept is not None else (0, b"")
    position = kept.position if kept is not None else 0
    fh.seek(position)
    while position < info.st_size:
        piece = fh.read(min(BLOCK, info.st_size - position))
        if not piece:
            break
        position += len(piece)
        # A "\r\n" cut between two blocks is one break, counted at its "\r".
        breaks += _breaks(piece) - (last == b"\r" and piece[:1] == b"\n")
        last = piece[-1:]
        del piece
    _breaks_kept.keep(key, Place.at(fd, info, position, 0, (breaks, last)))
    return breaks + (last not in (b"", b"\r", b"\n"))


def _last(fd: int, size: int, count: int) -> list[bytes]:
    """The last ``count`` (> 0) lines of the file's first ``size`` bytes, read from the end."""
    pieces: list[bytes] = []
    start, after = size, b""
    lines = 0  # how many lines bytes.splitlines finds in what was read (the first may be cut)
    while start > 0 and lines <= count:
        take = min(TAIL_BLOCK, start)
        start -= take
        piece = os.pread(fd, take, start)
        if not pieces:  # a last line whose break is not written yet is a line too
            lines += piece[-1:] not in (b"", b"\r", b"\n")
        lines += _breaks(piece) - (piece[-1:] == b"\r" and after[:1] == b"\n")
        after = piece
        pieces.append(piece)
    # Past the first break of what was read, its lines are the file's (the line before that
    # break may have begun earlier, and a "\n" at its very start may end an earlier "\r").
    found = b"".join(reversed(pieces)).splitlines()
    return found[-count:]


def _breaks(data: bytes) -> int:
    """How many line breaks ``data`` has (``\\r\\n`` is one)."""
    found = data.count(b"\n")
    if b"\r" in data:
        found += data.count(b"\r") - data.count(b"\r\n")
    return found


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
