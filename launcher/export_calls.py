"""The per-call part of an export row (docs/calls.md): a rollout's call records from
``calls.jsonl`` in the export's fixed shape, and its Arrow type.

A record's compact logprobs (``top`` as ``[token, logprob]`` pairs) become
``{token, logprob}`` objects here, so JSON Lines and Parquet carry the same values.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CALL_FIELDS", "call_arrow_type", "export_call"]

#: The fields of one exported call, in order.
CALL_FIELDS = (
    "index",
    "api",
    "model",
    "response_id",
    "request_id",
    "stream",
    "started_at",
    "ttfb_ms",
    "duration_ms",
    "status",
    "upstream_status",
    "error",
    "retries",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "finish_reason",
    "logprobs",
    "token_ids",
)


def _logprobs(compact: Any) -> dict[str, Any] | None:
    if not isinstance(compact, dict):
        return None
    top = compact.get("top")
    return {
        "token": compact.get("token") or [],
        "logprob": compact.get("logprob") or [],
        "top": [
            [{"token": pair[0], "logprob": pair[1]} for pair in alternatives if len(pair) == 2]
            for alternatives in top
        ]
        if isinstance(top, list)
        else None,
    }


def export_call(record: dict[str, Any]) -> dict[str, Any]:
    """One call record in the export's shape (every field of :data:`CALL_FIELDS`)."""
    out = {name: record.get(name) for name in CALL_FIELDS}
    out["stream"] = bool(record.get("stream"))
    out["retries"] = [
        {"status": r.get("status"), "kind": r.get("kind"), "request_id": r.get("request_id")}
        for r in record.get("retries") or []
        if isinstance(r, dict)
    ]
    out["logprobs"] = _logprobs(record.get("logprobs"))
    return out


def call_arrow_type() -> Any:
    """The Arrow struct of one exported call."""
    import pyarrow as pa

    alternative = pa.struct([("token", pa.string()), ("logprob", pa.float64())])
    return pa.struct(
        [
            ("index", pa.int64()),
            ("api", pa.string()),
            ("model", pa.string()),
            ("response_id", pa.string()),
            ("request_id", pa.string()),
            ("stream", pa.bool_()),
            ("started_at", pa.string()),
            ("ttfb_ms", pa.float64()),
            ("duration_ms", pa.float64()),
            ("status", pa.int64()),
            ("upstream_status", pa.int64()),
            ("error", pa.string()),
            (
                "retries",
                pa.list_(
                    pa.struct(
                        [("status", pa.int64()), ("kind", pa.string()), ("request_id", pa.string())]
                    )
                ),
            ),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("total_tokens", pa.int64()),
            ("cached_tokens", pa.int64()),
            ("cache_write_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),
            ("finish_reason", pa.string()),
            (
                "logprobs",
                pa.struct(
                    [
                        ("token", pa.list_(pa.string())),
                        ("logprob", pa.list_(pa.float64())),
                        ("top", pa.list_(pa.list_(alternative))),
                    ]
                ),
            ),
            ("token_ids", pa.list_(pa.int64())),
        ]
    )
