"""The eval config's ``[bridge]`` section: what the Responses and Messages routes may do.

```toml
[bridge]
hosted_tools = ["web_search"]   # provider-run tool types granted (none by default)
responses = "auto"              # auto | native | translate (openai/… models)
messages = "auto"               # auto | native | translate (anthropic/… models)
```

Absent, every default holds (docs/bridge.md, "Three APIs").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.apis import MODES, ApiOptions
from launcher.config_tables import optional_table
from launcher.errors import ValidationError

BRIDGE_KEYS = ("hosted_tools", "responses", "messages")


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
