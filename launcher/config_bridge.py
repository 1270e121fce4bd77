"""The eval config's ``[bridge]`` section: what the Responses and Messages routes may do, and
how the bridge calls the provider.

```toml
[bridge]
hosted_tools = ["web_search"]   # provider-run tool types granted (none by default)
responses = "auto"              # auto | native | translate (openai/… models)
messages = "auto"               # auto | native | translate (anthropic/… models)
upstream_http2 = "auto"         # auto | on | off (auto: on when the in-flight asked needs it)
```

Absent, every default holds (docs/bridge.md, "Three APIs" and "HTTP/2 to the provider").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.apis import MODES, ApiOptions
from launcher.config_tables import optional_table
from launcher.errors import ValidationError

BRIDGE_KEYS = ("hosted_tools", "responses", "messages", "upstream_http2")
HTTP2_MODES = ("off", "on", "auto")
"""``upstream_http2``: never, always, or when the rollouts in flight asked for do not fit the
open-file limit with one HTTP/1.1 connection per provider call (:func:`launcher.fdbudget.choose_http2`)."""


def bridge_options(data: dict[str, Any], path: Path) -> ApiOptions | None:
    """The ``[bridge]`` section of a parsed eval TOML, checked; None when it is absent."""
    section = optional_table(data, "bridge", BRIDGE_KEYS, path)
    if section is None:
        return None
    tools = section.get("hosted_tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
        raise ValidationError(f"bridge.hosted_tools must be a list of tool types in {path}")
    modes = {}
    for key in ("responses", "messages"):
        value = section.get(key, "auto")
        if value not in MODES:
            raise ValidationError(
                f"bridge.{key} must be one of {', '.join(MODES)} in {path}, got {value!r}"
            )
        modes[key] = value
    return ApiOptions(tuple(tools), modes["responses"], modes["messages"])


def upstream_http2(data: dict[str, Any], path: Path) -> str:
    """``[bridge] upstream_http2``, checked: one of :data:`HTTP2_MODES` (``"auto"`` when absent)."""
    section = optional_table(data, "bridge", BRIDGE_KEYS, path) or {}
    value = section.get("upstream_http2", "auto")
    if value not in HTTP2_MODES:
        raise ValidationError(
            f"bridge.upstream_http2 must be one of {', '.join(HTTP2_MODES)} in {path}, "
            f"got {value!r}"
        )
    return str(value)
