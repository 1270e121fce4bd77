"""One whole HTTP answer, as the project's clients return it: :class:`Reply`.

The rollout client returns it from every call whichever way the call went (the lean pool of
:mod:`~rollout_server.net.h1client`, or httpx through
:func:`~rollout_server.net.httpclient.send_whole`), so its callers read one type. Failures are
the :mod:`~rollout_server.net.wireerrors` types, on either way too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Reply"]


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer read whole: ``status``, ``headers`` (raw ``(name, value)`` pairs, names in
    lower case, in the order received) and ``body``."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (lower case), or ``None``."""
        key = name.encode("latin-1")
        for field, value in self.headers:
            if field == key:
                return value.decode("latin-1")
        return None

    def header_map(self) -> dict[str, str]:
        """Every header as text by lower-case name; repeated ones joined with ``", "`` (as
        httpx reads them)."""
        found: dict[str, str] = {}
        for field, value in self.headers:
            name, text = field.decode("latin-1"), value.decode("latin-1")
            found[name] = f"{found[name]}, {text}" if name in found else text
        return found

    def json(self) -> Any:
        """The body decoded as JSON (``ValueError`` when it is not)."""
        return json.loads(self.body)

    def text(self) -> str:
        """The body as UTF-8 text, undecodable bytes replaced."""
        return self.body.decode("utf-8", "replace")
