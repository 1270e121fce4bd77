"""The routes an editor extension needs beyond running runs (issue 27 item 16): a health probe,
the workspace's configs, rollouts and datasets, a config validated without starting a run,
one event stream for the whole workspace, diff, export and rubric, the OpenAPI description of
the whole API and the eval config's JSON Schema. :class:`launcher.daemon.api.ControlApp`
calls in here after its own routes (same guard, same error shape).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from launcher.daemon.catalog import diff_doc, list_configs, list_datasets, list_rollouts
from launcher.daemon.openapi import openapi_doc
from launcher.daemon.registry import ApiError, Registry, check_secrets, parse_start
from launcher.daemon.status import RunView
from launcher.daemon.tools import RUBRIC_TIMEOUT_S, export_args, rubric_args, run_tool
from launcher.daemon.watch import workspace_events
from launcher.errors import CLIError
from launcher.rundir.names import validate_run_name
from rollout_server.net.asgi import ASGIReceiveCallable, ASGISendCallable, HTTPScope, send_json

__all__ = ["ExtraRoutes", "send_html"]

Query = dict[str, list[str]]
ReadBody = Callable[[HTTPScope, ASGIReceiveCallable], Awaitable[Any]]
Stream = Callable[[ASGIReceiveCallable, ASGISendCallable, AsyncIterator[bytes]], Awaitable[None]]


def _json(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False).encode()


async def send_html(send: ASGISendCallable, page: str) -> None:
    """A complete 200 answer of HTML ``page``, not to be cached (the daemon's pages)."""
    body = page.encode("utf-8")
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class ExtraRoutes:
    """Routes over the workspace; ``route``/``run_route`` answer and return True, or return
    False for a path that is not theirs."""

    def __init__(
        self,
        registry: Registry,
        info: Callable[[], dict[str, Any]],
        read_body: ReadBody,
        stream: Stream,
    ) -> None:
        self.registry = registry
        self._info = info
        self._read_body = read_body
        self._stream = stream

    async def route(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        route: list[str],
        query: Query,
    ) -> bool:
        """``/v1/<route>`` for the workspace-wide routes."""
        method = scope["method"]
        listing: dict[tuple[str, ...], Callable[[Path], list[dict[str, Any]]]] = {
            ("configs",): list_configs,
            ("rollouts",): list_rollouts,
            ("datasets",): list_datasets,
        }
        if method == "GET" and tuple(route) in listing:
            found = await trio.to_thread.run_sync(listing[tuple(route)], self.registry.workspace)
            await send_json(send, 200, _json({route[0]: found}))
        elif method == "GET" and route == ["health"]:
            info = self._info()
            doc = {"status": "ok", "version": info["version"], "pid": info["pid"]}
            await send_json(send, 200, _json({**doc, "runs_active": len(info["runs_active"])}))
        elif method == "POST" and route == ["configs", "validate"]:
            request = parse_start(await self._read_body(scope, receive))
            await send_json(send, 200, _json(await self.registry.validate(request)))
        elif method == "GET" and route == ["events"]:
            await self._stream(receive, send, workspace_events(self.registry))
        elif method == "GET" and route == ["diff"]:
            await self._diff(send, query)
        elif method == "GET" and route == ["openapi.json"]:
            await send_json(send, 200, _json(openapi_doc(self._info()["version"])))
        elif method == "GET" and route == ["schema", "eval-config.json"]:
            from launcher.config_schema import eval_config_schema

            await send_json(send, 200, _json(eval_config_schema()))
        else:
            return False
        return True

    async def _diff(self, send: ASGISendCallable, query: Query) -> None:
        names = []
        for key in ("a", "b"):
            name = (query.get(key) or [""])[0]
            try:
                names.append(validate_run_name(name))
            except CLIError:
                raise ApiError(400, "VALIDATION", f"{key} must name a run") from None
        page = (query.get("page") or ["0"])[0] in ("1", "true")

        def compare() -> dict[str, Any] | str:
            a, b = (self.registry.view(name).run_dir for name in names)  # 404s
            return diff_doc(a, b, page=page)

        try:
            doc = await trio.to_thread.run_sync(compare)
        except CLIError as exc:
            raise ApiError.from_cli(exc.code, exc.message) from None
        if isinstance(doc, str):
            await send_html(send, doc)
        else:
            await send_json(send, 200, _json(doc))

    async def run_route(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        view: RunView,
        rest: list[str],
    ) -> bool:
        """``/v1/runs/{name}/<rest>`` for export and rubric."""
        if scope["method"] != "POST" or rest not in (["export"], ["rubric"]):
            return False
        body = await self._read_body(scope, receive)
        if not isinstance(body, dict):
            raise ApiError(400, "VALIDATION", "the request body must be a JSON object")
        workspace = self.registry.workspace
        if rest == ["export"]:
            doc = await run_tool(workspace, export_args(workspace, view.name, body))
        else:
            secrets = check_secrets(body.get("secrets") or {})
            args = rubric_args(workspace, view.name, body)
            doc = await run_tool(workspace, args, secrets=secrets, timeout_s=RUBRIC_TIMEOUT_S)
        await send_json(send, 200, _json(doc))
        return True
