"""JSON safety for values that come from user code (docs/spec/protocol.md §9.3).

Results must always be deliverable: non-finite numbers and values with no JSON form are dropped
from ``metrics`` and ``extra_fields``; a sample whose messages still cannot be encoded is reduced
to its reward, label and ``remove_sample``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .protocol import RolloutStatus
from .sdk import RolloutSample

__all__ = ["clean_text", "is_strict_json", "json_safe", "wire_sample"]

_DROP: Any = object()


def clean_text(text: str) -> str:
    """Replace lone surrogates (and anything else that is not valid UTF-8) with ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return clean_text(value) if isinstance(value, str) else value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _DROP
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else _DROP
    if isinstance(value, dict):
        return json_safe(value)
    if isinstance(value, list | tuple):
        items = [_safe(item) for item in value]
        return [item for item in items if item is not _DROP]
    return _DROP


def json_safe(mapping: dict[Any, Any]) -> dict[str, Any]:
    """A copy of ``mapping`` that strict JSON can encode: numeric keys are stringified, other
    non-string keys, non-finite numbers and values with no JSON form are dropped."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(key, str):
            name = clean_text(key)
        elif isinstance(key, numbers.Number) and not isinstance(key, bool | complex):
            name = str(key)
        else:
            continue
        cleaned = _safe(value)
        if cleaned is not _DROP:
            out[name] = cleaned
    return out


def is_strict_json(value: Any) -> bool:
    """True when ``value`` is plain JSON data: str keys, finite numbers, no foreign objects."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(
            isinstance(k, str) and is_strict_json(k) and is_strict_json(v) for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return all(is_strict_json(item) for item in value)
    return False


def wire_sample(sample: RolloutSample, status: RolloutStatus) -> dict[str, Any]:
    """The wire dict of ``sample`` for a result of ``status``, with §9.3 applied in order."""
    metrics = json_safe(sample.metrics) if isinstance(sample.metrics, dict) else {}
    extra = json_safe(sample.extra_fields) if isinstance(sample.extra_fields, dict) else {}
    label = sample.label if isinstance(sample.label, str) else None
    messages: Any = sample.messages
    if not (isinstance(messages, list) and is_strict_json(messages)) or (
        label is not None and not is_strict_json(label)
    ):
        messages, metrics, extra = [], {}, {}
        label = clean_text(label) if label is not None else None
    reward = sample.reward
    if status != RolloutStatus.SUCCESS or sample.remove_sample:
        reward = None
    return {
        "messages": messages,
        "label": label,
        "reward": reward,
        "remove_sample": bool(sample.remove_sample),
        "metrics": metrics,
        "extra_fields": extra,
    }
