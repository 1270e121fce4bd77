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
from bridge.errors import error_body
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


def models_doc(model: str) -> dict[str, Any]:
    """``GET …/models``: the one model this bridge calls, in a list both SDKs read (OpenAI's
    ``object``/``data`` entries with Anthropic's fields beside them, and Anthropic's paging)."""
    entry = {
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": "rollbridge",
        "type": "model",
        "display_name": model,
        "created_at": "1970-01-01T00:00:00Z",
    }
    return {
        "object": "list",
        "data": [entry],
        "has_more": False,
        "first_id": model,
        "last_id": model,
    }


#: Why a stored response cannot be retrieved, cancelled, deleted or listed here.
STATELESS = (
    "The bridge is stateless: no response is stored at the provider (store is false), so none "
    "can be retrieved, cancelled, deleted or have its input items listed; send the "
    "conversation in input"
)


def _rollout_routes(app: QuartTrio, bridge: Bridge) -> None:
    """Under a rollout's URL (the door has checked the token): the model list, and a 404 in
    OpenAI's shape saying why for the stored-response endpoints."""

    async def models(rollout_id: str) -> Response:
        return Response(dumps(models_doc(bridge.model)), content_type="application/json")

    async def stored(rollout_id: str, response_id: str) -> Response:
        body = error_body(404, STATELESS)
        return Response(dumps(body), status=404, content_type="application/json")

    for path in ("/v1/rollouts/<rollout_id>/models", "/v1/rollouts/<rollout_id>/v1/models"):
        app.add_url_rule(path, path, models, methods=["GET"])
    for tail in ("", "/cancel", "/input_items"):
        path = f"/v1/rollouts/<rollout_id>/responses/<response_id>{tail}"
        app.add_url_rule(path, path, stored, methods=["GET", "POST", "DELETE"])


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
        return Response(dumps(models_doc(bridge.model)), content_type="application/json")

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
    _rollout_routes(app, bridge)
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
