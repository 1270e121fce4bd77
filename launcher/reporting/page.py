"""The self-contained HTML shell shared by the report and the diff pages.

A page is one file: CSS and JavaScript are inlined from ``assets/``, the data is inline JSON,
and a Content-Security-Policy forbids every network load, so the page behaves the same from
``file://`` on a machine without network and can never fetch anything a transcript mentions.
Dynamic parts are built by the script with ``textContent`` only (never ``innerHTML`` with
data), so transcript text cannot inject markup.
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from typing import Any

__all__ = ["CSP", "asset", "esc", "fmt_num", "fmt_pct", "inline_json", "render_page"]

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)


def asset(name: str) -> str:
    """The text of ``launcher/reporting/assets/<name>``."""
    return resources.files("launcher.reporting").joinpath("assets", name).read_text("utf-8")


def esc(value: object) -> str:
    """HTML-escaped text of ``value`` (quotes included, safe in attributes)."""
    return html.escape(str(value), quote=True)


def inline_json(data: Any) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element (no ``</`` or ``<!--``)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def fmt_num(value: float | int | None, digits: int = 3) -> str:
    """A number for display: integers as is (thousands separated), floats to ``digits``
    significant decimals; an en dash for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def fmt_pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal."""
    return "–" if value is None else f"{value * 100:.1f}%"


def render_page(*, title: str, body: str, data: Any, script: str) -> str:
    """The whole document: ``body`` (trusted, already escaped HTML), ``data`` inlined as
    ``#page-data`` JSON, the shared script then ``script`` (an asset name)."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{asset('page.css')}</style></head><body>"
        f"{body}"
        f'<script type="application/json" id="page-data">{inline_json(data)}</script>'
        f"<script>{asset('common.js')}\n{asset(script)}</script></body></html>\n"
    )
