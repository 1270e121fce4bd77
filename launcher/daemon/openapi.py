"""The OpenAPI 3.1 description of the control API (``GET /v1/openapi.json``), written by hand
from docs/daemon.md so clients can generate types and editors can browse it. A test checks it
with openapi-spec-validator and that every route the daemon answers is described.
"""

from __future__ import annotations

from typing import Any

from launcher.daemon.stream import MAX_TAIL

__all__ = ["openapi_doc"]

_OBJ: dict[str, Any] = {"type": "object", "additionalProperties": True}
_ERROR: dict[str, Any] = {
    "description": "An error: the CLI's code and one-line message",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_SSE: dict[str, Any] = {
    "description": "Server-Sent Events",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
_HTML: dict[str, Any] = {
    "description": "A self-contained HTML page",
    "content": {"text/html": {"schema": {"type": "string"}}},
}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


def _ok(
    description: str, schema: dict[str, Any] | None = None, status: str = "200"
) -> dict[str, Any]:
    body = {"application/json": {"schema": schema or _OBJ}}
    return {status: {"description": description, "content": body}}


def _op(
    summary: str,
    responses: dict[str, Any],
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    errors: tuple[str, ...] = ("400", "404"),
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**responses}}
    for code in errors:
        op["responses"][code] = _ERROR
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _query(name: str, kind: str = "string", *, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": kind}}


def _schemas() -> dict[str, Any]:
    flags = {
        "rows": {"type": "string"},
        "limit": {"type": "integer"},
        "fresh": {"type": "boolean"},
        "retry_failed": {"type": "boolean"},
        "max_in_flight": {"type": "integer"},
        "tunnel": {"type": "string"},
        "advertise_url": {"type": "string"},
        "listener_port": {"type": "integer"},
        "secrets_file": {"type": "string"},
        "shard": {"type": "string", "description": "i/N: run only shard i (0 <= i < N)"},
        "ray": {
            "type": "string",
            "description": "A Ray cluster's HOST:PORT, 'local' (a one-node cluster of the "
            "run's own) or 'auto' (the daemon machine's cluster: RAY_ADDRESS, or `ray start`'s)",
        },
        "ray_min_replicas": {"type": "integer", "minimum": 1},
    }
    states = ["starting", "running", "cancelling", "finished", "cancelled", "failed", "interrupted"]
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                }
            },
        },
        "StartRequest": {
            "type": "object",
            "required": ["config"],
            "additionalProperties": False,
            "properties": {
                "config": {"type": "string", "description": "Path of the eval config"},
                "name": {"type": "string"},
                "secrets": {"type": "object", "additionalProperties": {"type": "string"}},
                **flags,
            },
        },
        "Run": {
            "type": "object",
            "required": ["name", "state"],
            "additionalProperties": True,
            "properties": {
                "name": {"type": "string"},
                "run_dir": {"type": "string"},
                "state": {"type": "string", "enum": states},
                "cause": {"type": ["string", "null"]},
                "stage": {"type": ["string", "null"]},
                "total": {"type": ["integer", "null"]},
                "done": {"type": "integer"},
                "pending": {"type": "integer"},
                "pass_rate": {"type": "number"},
                "returncode": {"type": ["integer", "null"]},
                "returncode_source": {"enum": ["exit", "inferred", None]},
                "error": _OBJ,
            },
        },
    }


def openapi_doc(version: str) -> dict[str, Any]:
    """The description, with the daemon's ``version`` as the API's."""
    run = {"$ref": "#/components/schemas/Run"}
    start = {"$ref": "#/components/schemas/StartRequest"}
    runs = {"type": "object", "properties": {"runs": {"type": "array", "items": run}}}
    cancel = {"type": "object", "properties": {"stage": {"type": "integer", "enum": [1, 2]}}}
    output = {
        "type": "string",
        "description": "A file inside the workspace, not under .osmosis/; an existing one only "
        "with overwrite (else 409)",
    }
    overwrite = {"type": "boolean", "default": False}
    export = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "format": {"enum": ["jsonl", "parquet"]},
            "output": output,
            "overwrite": overwrite,
        },
    }
    rubric = {
        "type": "object",
        "required": ["rubric"],
        "properties": {
            "rubric": {"type": "string"},
            "model": {"type": "string"},
            "judges": {"type": "string"},
            "number": {"type": "integer"},
            "output": {
                **output,
                "description": f"{output['description']}; DIR/ writes DIR/rubric_eval_result.json",
            },
            "overwrite": overwrite,
            "timeout": {"type": "number"},
            "score_min": {"type": "number"},
            "score_max": {"type": "number"},
            "secrets": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    paths: dict[str, Any] = {
        "/v1/daemon": {
            "get": _op("The daemon", _ok("version, pid, workspace, runs_active"), errors=())
        },
        "/v1/health": {"get": _op("Liveness", _ok("status ok"), errors=())},
        "/v1/openapi.json": {"get": _op("This description", _ok("OpenAPI 3.1"), errors=())},
        "/v1/schema/eval-config.json": {
            "get": _op("JSON Schema of configs/eval/*.toml", _ok("a JSON Schema"), errors=())
        },
        "/v1/configs": {"get": _op("The workspace's eval configs", _ok("configs"), errors=())},
        "/v1/configs/validate": {
            "post": _op(
                "Check a start request without starting", _ok("what the run would do"), body=start
            )
        },
        "/v1/rollouts": {"get": _op("The workspace's rollouts", _ok("rollouts"), errors=())},
        "/v1/datasets": {"get": _op("The workspace's datasets", _ok("datasets"), errors=())},
        "/v1/events": {
            "get": _op("Runs appearing, changing state and ending", {"200": _SSE}, errors=())
        },
        "/v1/diff": {
            "get": _op(
                "Compare run b against run a",
                {
                    "200": {
                        **_ok("the diff")["200"],
                        "content": {**_ok("")["200"]["content"], **_HTML["content"]},
                    }
                },
                params=[
                    _query("a", required=True),
                    _query("b", required=True),
                    _query("page", "boolean"),
                ],
                errors=("400", "404", "409"),
            )
        },
        "/v1/shutdown": {
            "post": _op(
                "Stop the daemon",
                _ok("shutting down", status="202"),
                body=_OBJ,
                errors=("400", "409"),
            )
        },
        "/v1/runs": {
            "get": _op("Every run", _ok("runs", runs), params=[_query("state")], errors=()),
            "post": _op(
                "Start or resume a run",
                _ok("name, run_dir", status="202"),
                body=start,
                errors=("400", "404", "409", "422"),
            ),
        },
        "/v1/runs/{name}": {"get": _op("One run", _ok("the run", run), params=[_NAME])},
        "/v1/runs/{name}/events": {
            "get": _op(
                "The run's journal records and state, resumable with Last-Event-ID",
                {"200": _SSE},
                params=[
                    _NAME,
                    _query("after", "integer"),
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}},
                ],
            )
        },
        "/v1/runs/{name}/cancel": {
            "post": _op(
                "First (stage 1) or second (stage 2) Ctrl-C",
                _ok("cancel_stage", status="202"),
                params=[_NAME],
                body=cancel,
                errors=("400", "404", "409"),
            )
        },
        "/v1/runs/{name}/logs": {
            "get": _op(
                "The redacted logs.txt (follow=1: Server-Sent Events)",
                {
                    "200": {
                        **_ok("first_line, lines")["200"],
                        "content": {**_ok("")["200"]["content"], **_SSE["content"]},
                    }
                },
                params=[
                    _NAME,
                    {
                        "name": "tail",
                        "in": "query",
                        "required": False,
                        "schema": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": MAX_TAIL,
                            "default": 100,
                        },
                    },
                    _query("follow", "boolean"),
                    {
                        **_query("after", "integer"),
                        "description": "follow=1: resume after this line (as Last-Event-ID)",
                    },
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}},
                ],
            )
        },
        "/v1/runs/{name}/items/{row}/{run}": {
            "get": _op(
                "One work item: index row, trajectory, diagnostics, usage",
                _ok("the item"),
                params=[
                    _NAME,
                    {"name": "row", "in": "path", "required": True, "schema": {"type": "integer"}},
                    {"name": "run", "in": "path", "required": True, "schema": {"type": "integer"}},
                ],
            )
        },
        "/v1/runs/{name}/usage": {
            "get": _op("Live usage of the rollouts in flight", _ok("usage"), params=[_NAME])
        },
        "/v1/runs/{name}/report": {"get": _op("The report page", {"200": _HTML}, params=[_NAME])},
        "/v1/runs/{name}/export": {
            "post": _op(
                "eval export: one row per rollout",
                _ok("the CLI's JSON envelope"),
                params=[_NAME],
                body=export,
                errors=("400", "404", "409", "422", "504"),
            )
        },
        "/v1/runs/{name}/rubric": {
            "post": _op(
                "eval rubric: score the run's rollouts with an LLM judge",
                _ok("the CLI's JSON envelope"),
                params=[_NAME],
                body=rubric,
                errors=("400", "404", "409", "422", "504"),
            )
        },
    }
    _guard_answers(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rollbridge daemon control API",
            "version": version,
            "description": "docs/daemon.md. Over the unix socket no token is asked; over --http "
            "every request needs Authorization: Bearer <token> from daemon.json.",
        },
        "servers": [{"url": "http://127.0.0.1"}],
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # Either none (the unix socket) or the bearer token (the --http listener).
        "security": [{}, {"bearer": []}],
        "paths": paths,
    }


def _answer(description: str) -> dict[str, Any]:
    return {**_ERROR, "description": description}


def _guard_answers(paths: dict[str, Any]) -> None:
    """The refusals of the ``--http`` listener's door (and of a body too large), on every
    operation they can answer."""
    for operations in paths.values():
        for method, op in operations.items():
            answers = op["responses"]
            answers.setdefault("401", _answer("--http only: a missing or wrong bearer token"))
            answers.setdefault(
                "421", _answer("--http only: the Host header does not name this daemon")
            )
            if method != "get":
                answers.setdefault(
                    "403",
                    _answer(
                        "--http only: a write from a browser origin not allowed "
                        "(the daemon's own, or one given with --allow-origin)"
                    ),
                )
                if "requestBody" in op:
                    answers.setdefault("413", _answer("the request body is over 1 MiB"))
