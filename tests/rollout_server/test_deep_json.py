"""Deeply nested JSON bodies are refused as validation errors (422), never 500."""

from __future__ import annotations

import pytest
import trio

from .conftest import Served

_DEPTHS = [100_000, 5_000, 900, 995, 999]


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _admission(value: bytes) -> bytes:
    return (
        b'{"rollout_id":"deep","chat_completions_url":"http://127.0.0.1:9/v1",'
        b'"initial_messages":[{"role":"user","content":"hi"}],"metadata":{"m":' + value + b"}}"
    )


@pytest.mark.parametrize("depth", _DEPTHS)
@pytest.mark.parametrize("where", ["body", "metadata", "message"])
async def test_deeply_nested_json_is_a_validation_error(
    served: Served, depth: int, where: str
) -> None:
    nested = _nested(depth)
    if where == "body":
        raw = nested
    elif where == "metadata":
        raw = _admission(nested)
    else:
        raw = (
            b'{"rollout_id":"deep2","chat_completions_url":"http://127.0.0.1:9/v1",'
            b'"initial_messages":[' + nested + b"]}"
        )
    with trio.fail_after(10):
        for path in ("/rollout", "/rollout/cancel"):
            response = await served.http.post(
                path, content=raw, headers={"content-type": "application/json"}
            )
            assert response.status_code in (202, 400, 422), (path, response.text[:300])
            if response.status_code == 422:
                detail = response.json()["detail"]
                assert isinstance(detail, list | str)
