"""Placement of in-sandbox trials: the sandbox image, the route to the bridge, per-trial wiring.

One :class:`Placement` per backend. It builds the rollout's bundle once and one sandbox image
per task environment (under a lock: concurrent first trials wait for the same build), holds the
:class:`~.route.SandboxRoute` the probe chose (or probes itself with the loopback candidate when
no supervisor asked), and turns the route into what one trial gets (:class:`TrialWiring`): the
chat URL the container dials (the route's base URL plus the rollout's own path, so the bridge
still counts usage per rollout), the main service's compose ``network_mode``, and the relay
target for the harness.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from .bundle import Bundle, BundleError, build_bundle, shipped_bundle
from .image import SandboxImage, ensure_image
from .probe import AGENT_PATH, decide_route
from .route import Candidate, ProbeReport, SandboxRoute

__all__ = [
    "AGENT_PATH",
    "Placement",
    "PlacementError",
    "SandboxTrial",
    "TrialWiring",
    "bridge_origin",
]

logger = logging.getLogger("rollout_server.harbor")


class PlacementError(RuntimeError):
    """The sandbox image cannot be made, or no route reaches the bridge (one-line message)."""


@dataclass(frozen=True)
class TrialWiring:
    """What one in-sandbox trial is given."""

    chat_url: str
    network_mode: str | None
    relay_target: str | None

    def harbor_env(self, trial: str, engine: str, pythonpath: str | None) -> dict[str, str]:
        """The Harbor child's variables for the harness (contract: ``docs/harbor.md``)."""
        env = {
            "ROLLBRIDGE_SANDBOX_URL": self.chat_url,
            "ROLLBRIDGE_TRIAL": trial,
            "ROLLBRIDGE_ENGINE": engine,
            "PYTHONPATH": os.pathsep.join(p for p in (str(AGENT_PATH), pythonpath) if p),
        }
        if self.relay_target is not None:
            env["ROLLBRIDGE_RELAY_TARGET"] = self.relay_target
        return env


@dataclass(frozen=True)
class SandboxTrial:
    """What a workflow-mode trial is staged with: its image, route and wiring to the bridge."""

    image: SandboxImage
    route: SandboxRoute
    wiring: TrialWiring
    package: str

    def evidence(self) -> dict[str, Any]:
        """Diagnostics fields: the route and the image the trial ran with."""
        return {"sandbox_route": self.route.to_json(), "sandbox_image": self.image.tag}


def bridge_origin(chat_url: str) -> tuple[str, int]:
    """``scheme://host:port`` and the port of a loopback chat URL."""
    parts = urlsplit(chat_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}", port


class Placement:
    """The sandbox image and the route of one backend's in-sandbox trials."""

    def __init__(self, *, engine: str | None, network: str, owner: str) -> None:
        self.engine = engine
        self.network = network
        self.owner = owner
        self.route: SandboxRoute | None = None
        self.report: ProbeReport | None = None
        self._lock = trio.Lock()
        self._bundle: Bundle | None = None
        self._images: dict[Path, SandboxImage] = {}
        # A sandbox image that failed to build fails every later trial of its environment at
        # once, with the same reason, instead of a build (and a failure) per trial.
        self._image_errors: dict[Path, str] = {}

    async def image_for(self, project_dir: Path, environment_dir: Path) -> SandboxImage:
        """The sandbox image of ``environment_dir`` with the rollout's bundle (built once)."""
        if self.engine is None:
            raise PlacementError(
                "workflow mode builds its sandbox image with podman or docker; "
                "use environment_type='podman' or 'docker'"
            )
        async with self._lock:
            try:
                if self._bundle is None:
                    self._bundle = shipped_bundle()
                    if self._bundle is not None:
                        logger.info(
                            "bundle: %s shipped with this replica", self._bundle.digest[:12]
                        )
                if self._bundle is None:
                    self._bundle = await trio.to_thread.run_sync(
                        lambda: build_bundle(
                            project_dir, python=Path(sys.executable), log=logger.info
                        )
                    )
                if environment_dir in self._image_errors:
                    raise PlacementError(self._image_errors[environment_dir])
                image = self._images.get(environment_dir)
                if image is None:
                    try:
                        image = await ensure_image(
                            self.engine, environment_dir, self._bundle, log=logger.info
                        )
                    except BundleError as exc:
                        self._image_errors[environment_dir] = str(exc)
                        raise
                    self._images[environment_dir] = image
            except BundleError as exc:
                raise PlacementError(str(exc)) from None
            return image

    @property
    def package_dir_name(self) -> str:
        """The import package of the rollout's files in the image (after :meth:`image_for`)."""
        if self._bundle is None:
            raise PlacementError("no bundle was built yet")
        return self._bundle.package_dir_name

    async def probe(
        self,
        image: str,
        candidates: Sequence[Candidate],
        *,
        bridge_port: int,
        exclusive: bool,
        nonce: str,
        expect: str | None,
    ) -> ProbeReport:
        """Run the probe ladder from a sandbox of ``image``; keep the route it found."""
        if self.engine is None:
            raise PlacementError("the sandbox probe needs podman or docker")
        report = await decide_route(
            engine=self.engine,
            image=image,
            network=self.network,
            bridge_port=bridge_port,
            candidates=candidates,
            exclusive=exclusive,
            nonce=nonce,
            expect=expect,
            owner=self.owner,
            log=logger.info,
        )
        self.report = report
        if report.route is not None:
            self.route = report.route
        return report

    async def answer(
        self, request: Mapping[str, Any], project_dir: Path, environment_dir: Path
    ) -> dict[str, Any]:
        """Answer a supervisor's probe request: the report JSON (the route is kept)."""
        candidates = [Candidate(c["kind"], c["url"]) for c in request["candidates"]]
        loopback = next((c for c in candidates if c.kind == "loopback"), candidates[0])
        image = await self.image_for(project_dir, environment_dir)
        report = await self.probe(
            image.tag,
            candidates,
            bridge_port=bridge_origin(loopback.url)[1],
            exclusive=bool(request.get("exclusive")),
            nonce=str(request["nonce"]),
            expect=request.get("expect"),
        )
        return report.to_json()

    async def ensure_route(self, image: str, chat_url: str) -> SandboxRoute:
        """The route; probed here with the loopback candidate when no supervisor set one."""
        async with self._lock:
            if self.route is not None:
                return self.route
            origin, port = bridge_origin(chat_url)
            # expect=None: no supervisor computed the bridge's answer, any answer counts.
            report = await self.probe(
                image,
                [Candidate("loopback", origin)],
                bridge_port=port,
                exclusive=False,
                nonce=secrets.token_hex(16),
                expect=None,
            )
            if self.route is not None:
                return self.route
        tried = ", ".join(
            f"{a.candidate.kind} {a.candidate.url}: {a.outcome}" for a in report.attempts
        )
        raise PlacementError(
            f"no route from the sandbox reaches the bridge (tried {tried or 'nothing'}); "
            "pass --advertise-url, or allow the tunnel"
        )

    def wiring(self, route: SandboxRoute, chat_url: str) -> TrialWiring:
        """The trial's chat URL, network mode and relay target under ``route``."""
        path = urlsplit(chat_url).path
        network_mode = route.network_mode or ("none" if self.network == "none" else None)
        relay: str | None = None
        if route.kind == "relay":
            host, port = route.relay_target or ("127.0.0.1", bridge_origin(chat_url)[1])
            relay = f"{host}:{port}"
        return TrialWiring(route.base_url.rstrip("/") + path, network_mode, relay)

    async def sandbox_trial(self, project_dir: Path, task_dir: Path, chat_url: str) -> SandboxTrial:
        """The image and the route of one trial (the first trial builds and probes)."""
        image = await self.image_for(project_dir, task_dir / "environment")
        route = await self.ensure_route(image.tag, chat_url)
        return SandboxTrial(image, route, self.wiring(route, chat_url), self.package_dir_name)
