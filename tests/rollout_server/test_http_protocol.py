"""docs/spec/protocol.md §2–§3 and §19 against a real server: status codes, bodies, headers."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
import trio

from rollout_server import ExecutionBackend, ExecutionOutcome, ExecutionRequest, LocalBackend
from rollout_server.client import Admission
from rollout_server.protocol import LEASE_HEADER, ChatEndpoint, RolloutStatus

from .conftest import Served
from .helpers import GATES, ScriptedGrader, ScriptedWorkflow, gate, request, start, started

BODY = {
    "initial_messages": [{"role": "user", "content": "hi"}],
    "chat_completions_url": "http://127.0.0.1:9/v1",
}


def body(rollout_id: str, **fields: Any) -> dict[str, Any]:
    return {**BODY, "rollout_id": rollout_id, **fields}


async def poll_final(http: httpx.AsyncClient, rollout_id: str, token: str) -> dict[str, Any]:
    while True:
        response = await http.get(f"/rollout/{rollout_id}/result", headers={LEASE_HEADER: token})
        assert response.status_code == 200, response.text
        data = response.json()
        if data["status"] in ("success", "failure", "cancelled"):
            return data


async def test_admission_body_is_exact(served: Served) -> None:
    with trio.fail_after(10):
        response = await served.http.post("/rollout", json=body("a1", label="L"))
        assert response.status_code == 202
        data = response.json()
        assert set(data) == {
            "rollout_id",
            "status",
            "polling_lease_token",
            "result_wait_timeout_sec",
            "polling_lease_timeout_sec",
        }
        assert data["rollout_id"] == "a1"
        assert data["status"] == "queued"
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", data["polling_lease_token"])
        assert data["result_wait_timeout_sec"] == 1.0
        assert data["polling_lease_timeout_sec"] == 10.0
        final = await poll_final(served.http, "a1", data["polling_lease_token"])
        # All five keys, never trajectory_messages, and the id echoed.
        assert set(final) == {"rollout_id", "status", "sample", "err_message", "err_category"}
        assert final["rollout_id"] == "a1"
        assert "trajectory_messages" not in final["sample"]
        assert final["sample"]["reward"] == 1.0
        # Case-insensitive header name.
        again = await served.http.get(
            "/rollout/a1/result", headers={LEASE_HEADER.lower(): data["polling_lease_token"]}
        )
        assert again.json() == final


async def test_result_codes_404_first_then_403_then_422(served: Served) -> None:
    with trio.fail_after(10):
        token = (await served.http.post("/rollout", json=body("b1"))).json()["polling_lease_token"]
        other = (await served.http.post("/rollout", json=body("b2"))).json()["polling_lease_token"]
        r = await served.http.get("/rollout/nope/result", headers={LEASE_HEADER: "wrong"})
        assert (r.status_code, r.json()) == (404, {"detail": "unknown rollout_id"})
        r = await served.http.get("/rollout/b1/result", headers={LEASE_HEADER: "wrong"})
        assert (r.status_code, r.json()) == (403, {"detail": "invalid polling lease"})
        r = await served.http.get("/rollout/b1/result", headers={LEASE_HEADER: other})
        assert r.status_code == 403
        r = await served.http.get("/rollout/b1/result")
        assert r.status_code == 422
        assert r.json()["detail"][0]["type"] == "missing"
        assert r.json()["detail"][0]["loc"] == ["header", LEASE_HEADER]
        r = await served.http.get("/rollout/b1/result", headers={LEASE_HEADER: ""})
        assert r.status_code == 422
        assert r.json()["detail"][0]["type"] == "string_too_short"
        assert (await poll_final(served.http, "b1", token))["status"] == "failure"


@pytest.mark.parametrize("bad_id", ["", ".", "..", "a/b", "a\\b", "a\x00b"])
async def test_rollout_id_must_be_one_path_segment(served: Served, bad_id: str) -> None:
    with trio.fail_after(10):
        r = await served.http.post("/rollout", json=body(bad_id))
        assert r.status_code == 422
        error = r.json()["detail"][0]
        assert error["loc"] == ["body", "rollout_id"]
        assert "single path segment" in error["msg"]


async def test_ids_with_colons_are_fine(served: Served) -> None:
    with trio.fail_after(10):
        assert (await served.http.post("/rollout", json=body("run:1.a-b_c"))).status_code == 202


@pytest.mark.parametrize(
    ("payload", "loc"),
    [
        ({"rollout_id": "x", "chat_completions_url": "u"}, ["body", "initial_messages"]),
        (body("x", initial_messages=[1]), ["body", "initial_messages", 0]),
        (body("x", label=5), ["body", "label"]),
        (body("x", llm_api_key=""), ["body", "llm_api_key"]),
        (body("x", grade="maybe"), ["body", "grade"]),
        (body("x", agent_timeout_sec="soon"), ["body", "agent_timeout_sec"]),
        (body("x", metadata=[1]), ["body", "metadata"]),
        ({**BODY, "rollout_id": 7}, ["body", "rollout_id"]),
    ],
)
async def test_validation_errors_are_422_lists(
    served: Served, payload: dict[str, Any], loc: list[Any]
) -> None:
    with trio.fail_after(10):
        r = await served.http.post("/rollout", json=payload)
        assert r.status_code == 422
        assert loc in [e["loc"] for e in r.json()["detail"]]
        # The server keeps serving.
        assert (await served.http.get("/health")).status_code == 200


async def test_llm_api_key_empty_message(served: Served) -> None:
    with trio.fail_after(10):
        r = await served.http.post("/rollout", json=body("k", llm_api_key=""))
        assert "llm_api_key must be omitted or a non-empty string" in r.json()["detail"][0]["msg"]


async def test_lax_numbers_and_unknown_fields(served: Served) -> None:
    with trio.fail_after(10):
        r = await served.http.post(
            "/rollout", json=body("lax", agent_timeout_sec="5", surprise={"x": 1})
        )
        assert r.status_code == 202


@pytest.mark.parametrize(
    "raw",
    [
        b'{"initial_messages": [], "rollout_id": "n", "chat_completions_url": "u", "agent_timeout_sec": NaN}',
        b'{"initial_messages": [], "rollout_id": "n", "chat_completions_url": "u", "agent_timeout_sec": Infinity}',
        b'{"initial_messages": [], "rollout_id": "n", "chat_completions_url": "u", "agent_timeout_sec": 1e999}',
        b'{"initial_messages": [',
        b"not json at all",
        b"[1, 2]",
        b'"just a string"',
    ],
)
async def test_malformed_and_non_finite_json_is_4xx(served: Served, raw: bytes) -> None:
    with trio.fail_after(10):
        r = await served.http.post(
            "/rollout", content=raw, headers={"Content-Type": "application/json"}
        )
        assert 400 <= r.status_code < 500
        assert "detail" in r.json()
        r = await served.http.post(
            "/rollout/cancel", content=raw, headers={"Content-Type": "application/json"}
        )
        assert 400 <= r.status_code < 500
        assert (await served.http.get("/health")).status_code == 200


async def test_form_encoded_body_is_422(served: Served) -> None:
    with trio.fail_after(10):
        r = await served.http.post("/rollout", data={"rollout_id": "f"})
        assert r.status_code == 422
        assert r.json()["detail"][0]["type"] == "model_attributes_type"


async def test_body_over_cap_is_413(nursery: trio.Nursery, tmp_path: Any) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, max_body_bytes=4096)
        async with httpx.AsyncClient(base_url=running.url) as http:
            big = body("big", metadata={"blob": "x" * 10_000})
            r = await http.post("/rollout", json=big)
            assert r.status_code == 413
            assert "4096" in r.json()["detail"]

            # Chunked upload without a Content-Length is capped while reading.
            async def chunks():  # type: ignore[no-untyped-def]
                for _ in range(10):
                    yield b"x" * 1000

            r = await http.post(
                "/rollout", content=chunks(), headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 413
            assert (await http.post("/rollout", json=body("small"))).status_code == 202
        await client.aclose()
        running.force_stop()


async def test_framework_defaults_404_405(served: Served) -> None:
    with trio.fail_after(10):
        r = await served.http.get("/nowhere")
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
        for method, path in (("GET", "/rollout"), ("GET", "/rollout/cancel"), ("POST", "/health")):
            r = await served.http.request(method, path)
            assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"})


async def test_health_payload_and_header(served: Served) -> None:
    with trio.fail_after(10):
        r = await served.http.get("/health")
        data = r.json()
        assert r.headers["x-osmosis-rollout-instance-id"] == "test-instance"
        assert data["instance_id"] == "test-instance"
        uuid.UUID(data["process_id"])
        assert len(data["process_id"]) == 36
        assert data["status"] == "ok"
        assert data["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}
        assert data["concurrency"] == {"max_concurrent": 8, "queued": 0, "running": 0}
        health = await served.client.health()
        assert health.instance_id == "test-instance"
        assert health.capacity == 8
        assert health.requires_public_url is False


async def test_health_defaults_and_chat_endpoint(
    nursery: trio.Nursery, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("_OSMOSIS_ROLLOUT_INSTANCE_ID", raising=False)
    with trio.fail_after(10):
        the_backend = LocalBackend(
            ScriptedWorkflow,
            ScriptedGrader,
            chat_endpoint={"environment": "docker", "requires_public_url": True},
        )
        running, client = await start(nursery, tmp_path, the_backend, instance_id=None)
        health = await client.health()
        assert health.body["instance_id"] == health.body["process_id"]
        assert health.capacity == 4
        assert health.requires_public_url is True
        assert health.chat_endpoint == ChatEndpoint(environment="docker", requires_public_url=True)
        assert health.body["chat_endpoint"] == {
            "environment": "docker",
            "requires_public_url": True,
        }
        await client.aclose()
        running.force_stop()


class NoCapacity(ExecutionBackend):
    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        raise AssertionError("never admitted")

    def has_capacity(self) -> bool:
        return False

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "max_queue_depth": 3, "instance_id": "overwritten"}


async def test_admission_order_422_503_429(nursery: trio.Nursery, tmp_path: Any) -> None:
    with trio.fail_after(15):
        running, client = await start(
            nursery, tmp_path, NoCapacity(), drain_timeout_sec=5.0, api_key="sekrit"
        )
        auth = {"Authorization": "Bearer sekrit"}
        async with httpx.AsyncClient(base_url=running.url, headers=auth) as http:
            health = (await http.get("/health")).json()
            assert health["max_queue_depth"] == 3
            assert health["instance_id"] == "test-instance"
            r = await http.post("/rollout", json=body("x"))
            assert (r.status_code, r.json()) == (
                429,
                {"detail": "rollout queue is full; retry later"},
            )
            assert r.headers["retry-after"] == "5"
            assert (await http.post("/rollout", json=body("../x"))).status_code == 422
            # Unauthenticated comes first of all.
            r = await http.post(
                "/rollout", json=body("../x"), headers={"Authorization": "bearer sekrit"}
            )
            assert (r.status_code, r.json()) == (401, {"detail": "unauthorized"})
        await client.aclose()
        running.service.accepting = False
        async with httpx.AsyncClient(base_url=running.url, headers=auth) as http:
            r = await http.post("/rollout", json=body("x"))
            assert (r.status_code, r.json()) == (503, {"detail": "rollout server is shutting down"})
            assert (await http.post("/rollout", json=body("../x"))).status_code == 422
        running.force_stop()


async def test_duplicate_id_is_409(served: Served) -> None:
    with trio.fail_after(10):
        assert (await served.http.post("/rollout", json=body("dup"))).status_code == 202
        r = await served.http.post("/rollout", json=body("dup"))
        assert (r.status_code, r.json()) == (409, {"detail": "rollout_id is already registered"})


async def test_api_key_guards_every_path(nursery: trio.Nursery, tmp_path: Any) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, api_key="k3y")
        async with httpx.AsyncClient(base_url=running.url) as http:
            for method, path in (
                ("GET", "/health"),
                ("GET", "/nowhere"),
                ("POST", "/rollout"),
                ("GET", "/rollout/x/result"),
                ("POST", "/rollout/cancel"),
            ):
                r = await http.request(method, path, headers={"Authorization": "Bearer nope"})
                assert (r.status_code, r.json()) == (401, {"detail": "unauthorized"})
        # Our client sends the bearer on every call.
        result = await client.run_rollout(request("authed", label="L"))
        assert result.status == RolloutStatus.SUCCESS
        await client.aclose()
        running.force_stop()
    with pytest.raises(ValueError):
        await start(nursery, tmp_path, api_key="   ")


async def test_cancel_selectors_and_dispositions(served: Served) -> None:
    with trio.fail_after(15):
        http = served.http
        tokens = {}
        for rid in ("c1", "c2", "d1"):
            tokens[rid] = (
                await http.post("/rollout", json=body(rid, metadata={"gate": f"never-{rid}"}))
            ).json()["polling_lease_token"]
        await started("c1").wait()
        for bad in ({}, {"ids": ["c1"], "all": True}, {"ids": None, "prefix": None, "all": False}):
            r = await http.post("/rollout/cancel", json=bad)
            assert (r.status_code, r.json()) == (
                422,
                {"detail": "pass exactly one selector: ids, prefix, or all"},
            )
        r = await http.post("/rollout/cancel")
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body"]
        r = await http.post("/rollout/cancel", json={"ids": "c1"})
        assert r.status_code == 422
        assert (await http.post("/rollout/cancel", json={"ids": []})).json() == {"dispositions": {}}
        r = await http.post("/rollout/cancel", json={"ids": ["c1", "nope", "c1"]})
        assert r.json() == {"dispositions": {"c1": "cancelled_running", "nope": "not_found"}}
        final = await poll_final(http, "c1", tokens["c1"])
        assert final == {
            "rollout_id": "c1",
            "status": "cancelled",
            "sample": None,
            "err_message": "cancelled",
            "err_category": None,
        }
        assert not (served.root / "c1" / "trajectory.json").exists()
        r = await http.post("/rollout/cancel", json={"prefix": "c"})
        assert r.json() == {"dispositions": {"c1": "not_found", "c2": "cancelled_running"}}
        assert (await poll_final(http, "c2", tokens["c2"]))["status"] == "cancelled"
        r = await http.post("/rollout/cancel", json={"prefix": ""})
        assert r.json()["dispositions"] == {
            "c1": "not_found",
            "c2": "not_found",
            "d1": "cancelled_running",
        }
        await poll_final(http, "d1", tokens["d1"])
        r = await http.post("/rollout/cancel", json={"all": True})
        assert set(r.json()["dispositions"].values()) == {"not_found"}
        # Our client's cancel.
        assert await served.client.cancel(ids=["c2"]) == {"c2": "not_found"}
        # A cancelled id stays reserved.
        assert (await http.post("/rollout", json=body("c1"))).status_code == 409
        for name in ("never-c1", "never-c2", "never-d1"):
            GATES.pop(name, None)


async def test_long_poll_returns_current_status_after_hold(served: Served) -> None:
    with trio.fail_after(15):
        token = (
            await served.http.post("/rollout", json=body("h1", metadata={"gate": "h1"}))
        ).json()["polling_lease_token"]
        await started("h1").wait()
        r = await served.http.get("/rollout/h1/result", headers={LEASE_HEADER: token})
        assert r.json() == {
            "rollout_id": "h1",
            "status": "running",
            "sample": None,
            "err_message": None,
            "err_category": None,
        }
        gate("h1").set()
        assert (await poll_final(served.http, "h1", token))["status"] == "success"


async def test_long_poll_returns_early_on_transition(nursery: trio.Nursery, tmp_path: Any) -> None:
    # A 60 s hold: the test would time out if the poll did not return on the transition.
    with trio.fail_after(20):
        running, client = await start(
            nursery, tmp_path, result_wait_timeout_sec=60.0, polling_lease_timeout_sec=120.0
        )
        admission: Admission = await client.admit(request("e1", label="L", metadata={"gate": "e1"}))
        await started("e1").wait()

        async def release() -> None:
            await trio.sleep(0.2)
            gate("e1").set()

        nursery.start_soon(release)
        statuses = []
        while True:
            result = await client.poll_once(admission)
            statuses.append(result.status.value)
            if result.is_terminal:
                break
        # A fast grader's grading -> success is folded into one answer (5 ms coalescing).
        assert statuses[-1] == "success"
        await client.aclose()
        running.force_stop()


class OddHealth(NoCapacity):
    def health(self) -> dict[str, Any]:
        return {"status": "ok", "weird": object(), "nan": float("nan"), "max_queue_depth": 2}


async def test_unencodable_health_fields_are_dropped(nursery: trio.Nursery, tmp_path: Any) -> None:
    with trio.fail_after(15):
        running, client = await start(nursery, tmp_path, OddHealth())
        health = await client.health()
        assert health.capacity == 2
        assert "weird" not in health.body and "nan" not in health.body
        assert health.instance_id == "test-instance"
        await client.aclose()
        running.force_stop()
