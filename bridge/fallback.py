"""The bridge's routes other than the chat calls: a quart-trio app (docs/spec/bridge.md §2–§3).

Everything :class:`bridge.app.ChatRoutes` does not answer comes here: 404 and 405 answers, the
sandbox probe (bridge.probe) and the daemon's health, model list and usage routes. It is
imported and built at its first request (:class:`bridge.app.FirstUse`): quart and its
dependencies are about a third of a starting bridge's CPU, and an eval run's requests are
often all chat calls.
"""

from __future__ import annotations

from typing import Any

from quart import Response
from quart_trio import QuartTrio

from bridge.codec import dumps
from bridge.handler import Bridge
from bridge.policy import check_auth
from bridge.probe import PROBE_PREFIX, ProbeKey, valid_nonce

__all__ = ["build_app"]


def _detail(status: int, detail: str) -> Response:
    return Response(dumps({"detail": detail}), status=status, content_type="application/json")


def _usage_doc(bridge: Bridge) -> dict[str, Any]:
    """``GET /v1/usage``: the usage counted per id so far and its totals."""
    rollouts = {rid: u.to_json() for rid, u in sorted(bridge.ledger.snapshot().items())}
    keys = ("calls", "prompt_tokens", "completion_tokens", "total_tokens")
    totals = {key: sum(doc.get(key, 0) for doc in rollouts.values()) for key in keys}
    largest = max((doc["max_context_tokens"] for doc in rollouts.values()), default=0)
    return {"rollouts": rollouts, "totals": {**totals, "max_context_tokens": largest}}


def _daemon_routes(app: QuartTrio, bridge: Bridge, token: str) -> None:
    """``bridge serve`` only: a health route (no token: it says nothing but "up"), the model
    list OpenAI clients ask for, and the usage counted so far (token required)."""
    from quart import request

    def unauthorized() -> Response | None:
        if check_auth(request.headers.get("Authorization"), token):
            return None
        return _detail(401, "Unauthorized")

    @app.get("/health")
    async def health() -> Response:
        return Response(dumps({"status": "ok"}), content_type="application/json")

    @app.get("/v1/models")
    async def models() -> Response:
        refused = unauthorized()
        if refused is not None:
            return refused
        entry = {"id": bridge.model, "object": "model", "created": 0, "owned_by": "rollbridge"}
        return Response(dumps({"object": "list", "data": [entry]}), content_type="application/json")

    @app.get("/v1/usage")
    async def usage() -> Response:
        refused = unauthorized()
        if refused is not None:
            return refused
        return Response(dumps(_usage_doc(bridge)), content_type="application/json")


def _probe_route(app: QuartTrio, probe: ProbeKey) -> None:
    """The sandbox probe's answer; no bearer (bridge.probe says why)."""

    async def probe_answer(nonce: str) -> Response:
        if not valid_nonce(nonce):
            return _detail(400, "invalid probe nonce")
        return Response(
            dumps({"rollbridge_probe": probe.answer(nonce)}), content_type="application/json"
        )

    app.add_url_rule(PROBE_PREFIX + "<nonce>", "sandbox_probe", probe_answer, methods=["GET"])


def build_app(
    bridge: Bridge, *, token: str, plain_chat_route: bool, probe: ProbeKey | None
) -> QuartTrio:
    """The quart app behind :func:`bridge.app.create_app` (same arguments)."""
    app = QuartTrio("rollbridge-bridge")
    # Quart's defaults cut long answers (docs/hazards.md #5): a streamed or trickled answer may run
    # as long as the provider takes, and the body is already read by BufferedBody.
    app.config.update(
        RESPONSE_TIMEOUT=None,
        BODY_TIMEOUT=None,
        MAX_CONTENT_LENGTH=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )

    # ChatRoutes answers every POST to these paths before quart sees the request. The routes
    # are declared here only so that quart answers the other methods with 405, as it always has.
    async def declared_only(**_: str) -> Response:
        return _detail(404, "Not Found")

    app.add_url_rule(
        "/v1/rollouts/<rollout_id>/chat/completions",
        "rollout_chat",
        declared_only,
        methods=["POST"],
    )
    if plain_chat_route:
        app.add_url_rule("/v1/chat/completions", "plain_chat", declared_only, methods=["POST"])
        _daemon_routes(app, bridge, token)
    if probe is not None:
        _probe_route(app, probe)

    @app.errorhandler(404)
    async def not_found(_: Exception) -> Response:
        return _detail(404, "Not Found")

    @app.errorhandler(405)
    async def not_allowed(_: Exception) -> Response:
        return _detail(405, "Method Not Allowed")

    @app.errorhandler(413)
    async def too_large(_: Exception) -> Response:
        return _detail(413, "Request Entity Too Large")

    return app
