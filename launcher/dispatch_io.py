"""The dispatcher's real collaborators: the bridge as the model endpoint, and the long-poll
client as the rollout transport (see the seams in :mod:`launcher.dispatch`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from launcher.dispatch import RolloutRefused
from launcher.rollout_child import RolloutServer
from rollout_server.client import (
    Admission,
    AdmissionRejected,
    RolloutClient,
    RolloutServerUnreachable,
)
from rollout_server.protocol import RolloutInitRequest, RolloutResultResponse

if TYPE_CHECKING:
    from bridge.server import BridgeHandle
    from tunnel.cloudflared import TunnelHandle

__all__ = ["BridgeEndpoint", "RolloutClientTransport"]


class BridgeEndpoint:
    """The :class:`launcher.dispatch.ModelEndpoint` of a run: the bridge, reached directly,
    through the user's ``--advertise-url``, or through the managed tunnel."""

    def __init__(
        self,
        bridge: BridgeHandle,
        bearer: str,
        tunnel: TunnelHandle | None,
        advertise_url: str | None,
    ) -> None:
        self._bridge = bridge
        self._bearer = bearer
        self._tunnel = tunnel
        self._advertise_url = advertise_url

    @property
    def bearer(self) -> str:
        """The per-run key the bridge accepts."""
        return self._bearer

    def base_url(self) -> str:
        """The base the sandbox should use now: tunnel, advertised URL, else loopback."""
        if self._tunnel is not None and self._tunnel.public_url:
            return self._tunnel.public_url
        if self._advertise_url:
            return self._advertise_url
        return self._bridge.base_url

    def chat_url(self, rollout_id: str) -> str:
        """The rollout's ``chat_completions_url`` (its id is in the path, for usage)."""
        return self._bridge.rollout_url(rollout_id, self.base_url())

    async def ready(self) -> None:
        """A restarting tunnel publishes its new URL before the next admission."""
        if self._tunnel is not None:
            await self._tunnel.wait_available()

    def take_usage(self, rollout_id: str) -> tuple[int | None, int | None]:
        """Pop the bridge's token counts for a finished rollout."""
        found = self._bridge.ledger.pop(rollout_id)
        if found is None:
            return None, None
        return found.total_tokens, found.max_context_tokens

    def forget(self, rollout_id: str) -> None:
        """Drop the counts of a rollout that will not be recorded."""
        self._bridge.ledger.discard(rollout_id)


class _AdmittedRollout:
    def __init__(self, client: RolloutClient, admission: Admission) -> None:
        self._client = client
        self._admission = admission

    async def wait(self) -> RolloutResultResponse:
        return await self._client.wait_for_result(self._admission)


class RolloutClientTransport:
    """The :class:`launcher.dispatch.RolloutTransport` over the long-poll client.

    Retries (429, connect-phase failures while the server lives) are the client's; this adapter
    only turns a 4xx refusal into :class:`RolloutRefused` and names a dead server as the cause.
    """

    def __init__(self, client: RolloutClient, server: RolloutServer) -> None:
        self._client = client
        self._server = server

    async def admit(
        self, request: RolloutInitRequest, admission_timeout_s: float
    ) -> _AdmittedRollout:
        """``POST /rollout``; a 4xx other than 429 is a refusal of this item."""
        try:
            admission = await self._client.admit(request, admission_timeout_sec=admission_timeout_s)
        except AdmissionRejected as exc:
            code = exc.status_code or 0
            if 400 <= code < 500 and code != 429:
                raise RolloutRefused(code, str(exc)) from None
            raise
        return _AdmittedRollout(self._client, admission)

    async def cancel(self, rollout_id: str) -> None:
        """Ask the server to cancel one rollout."""
        await self._client.cancel([rollout_id])

    async def explain(self, exc: BaseException) -> str | None:
        """The server's exit as the cause of a transport failure (it may take a moment for the
        exit to be observable after its sockets closed)."""
        if not isinstance(exc, RolloutServerUnreachable):
            return None
        with trio.move_on_after(1.0):
            code = await self._server.child.process.wait()
            return f"the rollout server exited with code {code}; see logs.txt"
        return None
