"""Property tests: no blocked field ever reaches the provider; no body crashes the bridge."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import BridgeConfig, BridgeHandle, run_bridge
from bridge._blocked import BLOCKED_NAMES, RESERVED_PREFIXES
from bridge.errors import BridgeRequestError
from bridge.policy import ENVELOPE_FIELDS, is_blocked, prepare
from tests.bridge.conftest import AUTH, TOKEN, url
from tests.fakes.upstream import FakeUpstream, run_fake_upstream

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
names = st.one_of(
    st.sampled_from(sorted(BLOCKED_NAMES)),
    st.builds(lambda p, s: p + s, st.sampled_from(RESERVED_PREFIXES), st.text(max_size=5)),
    st.sampled_from(
        sorted(ENVELOPE_FIELDS | {"temperature", "metadata", "provider", "extra_body"})
    ),
    st.text(max_size=10),
)
flat = st.dictionaries(names, json_values, max_size=6)
bodies = st.builds(
    lambda top, extra, use_extra: {**top, "extra_body": extra} if use_extra else top,
    flat,
    st.one_of(flat, json_values),
    st.booleans(),
)


@given(bodies)
@settings(max_examples=400, deadline=None)
def test_policy_never_lets_a_blocked_field_through(body: dict[str, Any]) -> None:
    try:
        prepared = prepare(body)
    except BridgeRequestError as exc:
        assert exc.status == 400
        return
    assert not [key for key in prepared.params if is_blocked(key)]
    assert not ENVELOPE_FIELDS & prepared.params.keys()
    assert "extra_body" not in prepared.params


async def _post_through_bridge(
    body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[httpx.Response, list[Any]]:
    async with trio.open_nursery() as nursery:
        upstream: FakeUpstream = await nursery.start(run_fake_upstream)
        monkeypatch.setenv("OPENAI_BASE_URL", upstream.v1)
        handle: BridgeHandle = await nursery.start(
            run_bridge, BridgeConfig(model="openai/test-model", token=TOKEN)
        )
        with trio.fail_after(20):
            async with httpx.AsyncClient(timeout=20) as client:
                raw = json.dumps(body).encode()
                response = await client.post(url(handle), content=raw, headers=AUTH)
                await response.aread()
        nursery.cancel_scope.cancel()
    return response, [r.body for r in upstream.requests]


@given(body=bodies)
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_no_body_reaches_upstream_with_blocked_fields(
    monkeypatch: pytest.MonkeyPatch, body: dict[str, Any]
) -> None:
    # One bridge and fake upstream per example: hypothesis runs each example on its own.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-provider-key-for-tests-000000")
    response, forwarded = trio.run(_post_through_bridge, body, monkeypatch)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        doc = response.json()
        if "error" not in doc:
            # json.dumps wrote a float the body holds as Infinity/NaN: not JSON, refused whole.
            assert doc["detail"].startswith("invalid body: ") and "is not JSON" in doc["detail"]
            assert forwarded == []
        else:
            assert doc["error"]["type"] == "invalid_request_error"
    for sent in forwarded:
        assert isinstance(sent, dict)
        assert not [k for k in sent if k not in ("model", "messages") and is_blocked(k)]
