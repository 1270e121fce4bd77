"""Read a generated page back: the ``data-metric`` values, histogram bars, the inline JSON and
every attribute or CSS reference that could load something."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

__all__ = ["ParsedPage", "external_references", "parse_page"]


@dataclass
class ParsedPage:
    """What a test compares with the run's files."""

    metrics: dict[str, str] = field(default_factory=dict)
    bars: dict[str, list[int]] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    status_counts: dict[str, int] = field(default_factory=dict)
    error_counts: dict[str, int] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    urls: list[str] = field(default_factory=list)


class _Parser(HTMLParser):
    def __init__(self, page: ParsedPage) -> None:
        super().__init__(convert_charrefs=True)
        self.page = page
        self._figure: str | None = None
        self._row: tuple[str, str] | None = None
        self._in_data = False
        self._data: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("src", "href", "action", "srcset", "poster", "data", "xlink:href"):
            if key in a:
                self.page.urls.append(a[key])
        if "data-metric" in a:
            self.page.metrics[a["data-metric"]] = a.get("data-value", "")
        if tag == "figure" and "data-field" in a:
            self._figure = a["data-field"]
            self.page.bars[self._figure] = []
            self.page.missing[self._figure] = int(a["data-missing"])
        if tag == "rect" and self._figure is not None:
            self.page.bars[self._figure].append(int(a["data-count"]))
        if tag == "tr" and "data-status" in a:
            self._row = ("status", a["data-status"])
        if tag == "tr" and "data-error" in a:
            self._row = ("error", a["data-error"])
        if tag == "td" and self._row is not None and "data-value" in a:
            kind, key = self._row
            target = self.page.status_counts if kind == "status" else self.page.error_counts
            target[key] = int(a["data-value"])
            self._row = None
        if tag == "script" and a.get("id") == "page-data":
            self._in_data = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._figure = None
        if tag == "script" and self._in_data:
            self._in_data = False
            self.page.data = json.loads("".join(self._data))

    def handle_data(self, data: str) -> None:
        if self._in_data:
            self._data.append(data)


def parse_page(text: str) -> ParsedPage:
    """Parse a report or diff page."""
    page = ParsedPage()
    parser = _Parser(page)
    parser.feed(text)
    parser.close()
    return page


_CSS_URL = re.compile(r"url\(|@import", re.IGNORECASE)
_SCHEME = re.compile(r"\b(?:https?|wss?|ftp):|//[a-z0-9.-]+\.[a-z]{2,}/", re.IGNORECASE)


def external_references(text: str) -> list[str]:
    """Anything in the page's markup, CSS or script (the inline data and the log excluded)
    that names a network location or could load one."""
    page = parse_page(text)
    found = [u for u in page.urls if u and not u.startswith(("#", "data:"))]
    code = re.sub(
        r'<script type="application/json" id="page-data">.*?</script>', "", text, flags=re.S
    )
    code = re.sub(r'<pre class="log">.*?</pre>', "", code, flags=re.S)
    found += _CSS_URL.findall(code)
    found += _SCHEME.findall(code)
    return found
