"""HarborBackend: each rollout is one Harbor trial, run as its own ``harbor trial start``.

Why a subprocess per trial rather than Harbor's asyncio ``TrialQueue`` in-process: the rollout
server stays pure trio (no asyncio loop, no Harbor import in the server), a Harbor crash cannot
take the server down, cancelling is a signal to one process group, and the trial config is a file
that can be replayed by hand. Harbor's import is paid once per server by the long-lived worker
(:mod:`.forkserver`) for model-free agents; ``scripts/bench/bench_harbor.py`` measures each
phase against Harbor's own CLI.

Why one module of this size: it is the one place a trial's whole story is told in order (slot,
staging, process, outcome, archive, retirement) beside the constructor's documented options;
every step's mechanics already live in sibling modules.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from ..backend import ExecutionBackend, ExecutionOutcome, ExecutionRequest
from ..probe_route import PROBE_ROUTE
from ..protocol import RolloutErrorCategory, RolloutStatus
from ..sdk import AgentWorkflow, Grader, get_rollout_context
from . import containers
from .archive import archive_trial, retire_trial_dir
from .fastexec import install_compose_shim
from .forkserver import HarborWorker, harbor_python
from .installed import installed_env
from .locate import HarborSetupError, find_harbor
from .placement import Placement, PlacementError, SandboxTrial, TrialWiring
from .process import run_trial_process
from .reaper import reap_dead_owners
from .results import failed, trial_outcome
from .staging import (
    StagedTrial,
    prompt_text,
    stage_trial,
    timeout_note,
    trial_config,
    write_private,
)
from .taskimage import TaskImages, use_task_image
from .teardown import DEFER_DOWN_ENV, Teardowns
from .timings import TrialClock
from .trialreport import (
    REPORTS_ENV,
    container_exit,
    container_exit_outcome,
    container_gone,
    with_verifier_detail,
)
from .workflow import HARNESS_AGENT, WorkflowSpec, stage_workflow

__all__ = ["HOST_SIDE_AGENTS", "HarborBackend", "HarborSetupError", "find_harbor"]

logger = logging.getLogger("rollout_server.harbor")

#: Agents that run on the host and drive the sandbox through ``exec``: they reach the loopback
#: bridge directly, so they never need a public URL.
HOST_SIDE_AGENTS = frozenset({"oracle", "nop", "terminus", "terminus-1", "terminus-2"})
#: Agents that make no model calls at all.
MODEL_FREE_AGENTS = frozenset({"oracle", "nop"})
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
#: Harbor's agent timeout beyond the workflow's own (the runner enforces that one itself).
_HARNESS_GRACE_S = 60.0
#: Harbor and LiteLLM phone home unless told not to; a trial must only talk to this machine.
_QUIET_ENV = {"HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
#: How long a stopping server waits for its background teardowns (each podman call is bounded
#: by 60 s; whatever is left is removed by the owner sweep below, or reaped by label later).
_TEARDOWN_WAIT_S = 120.0


def _is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


class HarborBackend(ExecutionBackend):
    """Run each rollout as a Harbor trial in a sandbox.

    ``tasks_dir``: in ``mode="template"`` one Harbor task (the directory itself, or its only
    task subdirectory, or ``task`` inside it) whose ``instruction.md`` is replaced by the row's
    prompt; in ``mode="dataset"`` a directory of tasks, and each row names its task with
    ``metadata["harbor_task"]`` (a path relative to ``tasks_dir``).
    ``environment_type``/``environment_kwargs``: Harbor's environment (``podman``, ``docker``,
    ...). ``agent``: a Harbor agent name or an ``module:Class`` import path, with
    ``agent_kwargs`` and ``model_name``. ``concurrency`` trials run at once; up to
    ``max_queue_depth`` more wait (admission answers 429 beyond that).
    ``cleanup_successful_trials`` removes a trial's Harbor dir once its archive is complete,
    whatever the trial's outcome (the name is the reference's; failed trials are archived too);
    ``False`` keeps every trial's dir, scrubbed. ``extra_docker_compose``: compose overlays
    added to every trial (the backend adds its own, with ``init: true`` when ``init`` and the
    labels orphan reaping needs).
    ``secret_env``: names of environment variables whose values are scrubbed from archives (the
    rollout's bearer and variables named like secrets always are). ``cancel_grace_sec``: how long
    Harbor gets to clean up after SIGINT before SIGKILL.

    Workflow mode (``workflow=``, an :class:`~rollout_server.sdk.AgentWorkflow` subclass, with
    ``grader=``, ``config=`` and ``grader_config=``): the workflow runs inside the trial's
    container under the harness agent, from a sandbox image holding the rollout's bundle; the
    label reaches the container only with ``tests/`` at verification. ``sandbox_network``:
    ``"auto"`` (the probe picks the route) or ``"none"`` (the main service has no network; the
    exec relay carries the model calls). See ``docs/harbor.md``.

    ``prebuild_images`` (default on; ``ROLLBRIDGE_HARBOR_PREBUILD=0`` turns the default off):
    build a task's plain ``environment/Dockerfile`` once per server and start every trial from
    that image instead of a build per trial (:mod:`.taskimage`). ``harbor_worker`` (default on
    for model-free agents; ``ROLLBRIDGE_HARBOR_WORKER=0`` turns the default off): fork each
    trial's Harbor process from one long-lived worker that imported Harbor once
    (:mod:`.forkserver`), instead of starting an interpreter per trial. ``fast_exec`` (default
    on; ``ROLLBRIDGE_HARBOR_FAST_EXEC=0``): on podman, Harbor's ``exec`` calls go straight to
    ``podman exec`` instead of through podman-compose (:mod:`.fastexec`).
    ``overlap_teardown`` (default on where ``fast_exec`` is; ``ROLLBRIDGE_HARBOR_OVERLAP=0``):
    a trial's containers are removed in the background after its result is answered and its
    slot freed, at most ``concurrency`` teardowns at a time (:mod:`.teardown`).
    """

    def __init__(
        self,
        tasks_dir: str | os.PathLike[str],
        *,
        mode: str = "template",
        task: str | None = None,
        environment_type: str = "podman",
        environment_kwargs: Mapping[str, Any] | None = None,
        agent: str = "oracle",
        agent_kwargs: Mapping[str, Any] | None = None,
        model_name: str | None = None,
        concurrency: int = 4,
        max_queue_depth: int = 1024,
        cleanup_successful_trials: bool = True,
        extra_docker_compose: Sequence[str | os.PathLike[str]] = (),
        init: bool = True,
        secret_env: Sequence[str] = (),
        harbor_command: str | Sequence[str] | None = None,
        trials_root: str | os.PathLike[str] | None = None,
        cancel_grace_sec: float = 60.0,
        reap_orphans: bool = True,
        workflow: type[AgentWorkflow[Any]] | None = None,
        grader: type[Grader] | None = None,
        config: Any = None,
        grader_config: Any = None,
        sandbox_network: str = "auto",
        prebuild_images: bool | None = None,
        harbor_worker: bool | None = None,
        fast_exec: bool | None = None,
        overlap_teardown: bool | None = None,
    ) -> None:
        if mode not in ("template", "dataset"):
            raise ValueError("mode must be 'template' or 'dataset'")
        if sandbox_network not in ("auto", "none"):
            raise ValueError(f"sandbox_network must be 'auto' or 'none', got {sandbox_network!r}")
        self.workflow_spec: WorkflowSpec | None = None
        if workflow is not None:
            self.workflow_spec = WorkflowSpec.build(workflow, grader, config, grader_config)
            agent = HARNESS_AGENT
        elif grader is not None or config is not None or grader_config is not None:
            raise ValueError("grader=, config= and grader_config= need workflow=")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError("concurrency must be a positive int")
        if not re.fullmatch(r"[a-z][a-z0-9-]*|[\w.]+:[\w.]+", agent):
            raise ValueError(f"agent must be a Harbor agent name or 'module:Class', got {agent!r}")
        self.tasks_dir = Path(tasks_dir).resolve()
        self.mode = mode
        self.template_task: Path | None = self._template_task(task) if mode == "template" else None
        if mode == "dataset" and not self.tasks_dir.is_dir():
            raise HarborSetupError(f"tasks directory {self.tasks_dir} does not exist")
        self.environment_type = environment_type
        self.environment_kwargs = dict(environment_kwargs or {})
        self.agent = agent
        self.agent_kwargs = dict(agent_kwargs or {})
        self.model_name = model_name
        self.concurrency = concurrency
        self.max_queue_depth = max_queue_depth
        self.cleanup_successful_trials = cleanup_successful_trials
        self.extra_docker_compose = [Path(p).resolve() for p in extra_docker_compose]
        self.init = init
        self.secret_env = tuple(secret_env)
        self.harbor_command = harbor_command
        self.cancel_grace_sec = cancel_grace_sec
        default_root = Path(tempfile.gettempdir()) / f"rollbridge-harbor-{os.getuid()}"
        self.trials_root = Path(trials_root) if trials_root is not None else default_root
        self._slots = trio.Semaphore(concurrency)
        self._queued = 0
        self._running = 0
        self._owner = containers.owner_token()
        self._timeouts_noted: set[str] = set()
        self.engine: str | None = (
            environment_type if environment_type in ("podman", "docker") else None
        )
        self.sandbox_network = sandbox_network
        self._placement = Placement(engine=self.engine, network=sandbox_network, owner=self._owner)
        if harbor_worker is None:
            # Model-calling agents keep a process of their own: their bearer is in its
            # environment from its start (what the trial tests look for), never on a pipe.
            harbor_worker = (
                os.environ.get("ROLLBRIDGE_HARBOR_WORKER", "1") != "0"
                and agent in MODEL_FREE_AGENTS
            )
        self._use_worker = harbor_worker
        if fast_exec is None:
            fast_exec = os.environ.get("ROLLBRIDGE_HARBOR_FAST_EXEC", "1") != "0"
        self._fast_exec = fast_exec and environment_type == "podman"
        if overlap_teardown is None:
            overlap_teardown = os.environ.get("ROLLBRIDGE_HARBOR_OVERLAP", "1") != "0"
        # The compose shim (fast_exec) is what hands Harbor's final `down` over.
        self._teardowns = (
            Teardowns(environment_type, concurrency)
            if overlap_teardown and self._fast_exec
            else None
        )
        self._shim_dir: Path | None = None
        self._worker: HarborWorker | None = None
        if prebuild_images is None:
            prebuild_images = os.environ.get("ROLLBRIDGE_HARBOR_PREBUILD", "1") != "0"
        self._task_images = (
            TaskImages(self.engine) if prebuild_images and self.engine is not None else None
        )
        # ROLLBRIDGE_HARBOR_WARM=0 also keeps the worker and the task image for the first trial.
        self._warm_up_early = os.environ.get("ROLLBRIDGE_HARBOR_WARM", "1") != "0"
        self._warming = False
        if reap_orphans:
            engine = self.engine if self.engine and shutil.which(self.engine) else None
            reap_dead_owners(engine, self.trials_root)

    # -- configuration ---------------------------------------------------------------------

    def _template_task(self, task: str | None) -> Path:
        root = self.tasks_dir
        if task is not None:
            root = root / task
        if _is_task_dir(root):
            return root
        found = sorted(p for p in root.iterdir() if _is_task_dir(p)) if root.is_dir() else []
        if len(found) != 1:
            raise HarborSetupError(
                f"template mode needs exactly one Harbor task in {root} (found {len(found)}); "
                "pass task=<name> or mode='dataset'"
            )
        return found[0]

    @property
    def uses_chat_endpoint(self) -> bool:
        """Whether the agent calls the model (through the rollout's bridge URL)."""
        return self.agent not in MODEL_FREE_AGENTS

    @property
    def host_side_agent(self) -> bool:
        """Whether the agent runs on the host (so the loopback bridge URL reaches it)."""
        return self.workflow_spec is None and self.agent in HOST_SIDE_AGENTS

    @property
    def placed_in_sandbox(self) -> bool:
        """Whether the agent is the workflow harness: in the sandbox, placed by the probe."""
        return self.workflow_spec is not None

    def _chat_endpoint(self) -> dict[str, Any]:
        endpoint: dict[str, Any] = {"environment": self.environment_type or "custom"}
        if self.placed_in_sandbox:
            # podman/docker on this machine can always be reached (slirp, or the exec relay);
            # a remote environment needs a URL it can dial, found by the probe.
            endpoint["requires_public_url"] = self.engine is None
            endpoint["probe"] = PROBE_ROUTE
        else:
            # A host-side agent dials the loopback bridge itself; another in-sandbox agent on
            # a bridged network cannot reach this machine's loopback.
            endpoint["requires_public_url"] = self.uses_chat_endpoint and not self.host_side_agent
        return endpoint

    def health(self) -> dict[str, Any]:
        """The reference's Harbor ``/health`` fields; host-side agents need no public URL.

        The first call inside trio (the supervisor asks before it dispatches) also starts, in
        the background, what the first trials would otherwise wait for (:meth:`_warm_up`)."""
        self._start_warm_up()
        return {
            "status": "ok",
            "backend": "harbor",
            "agent": self.agent,
            "in_flight": self._queued + self._running,
            "running": self._running,
            "queued": self._queued,
            "tearing_down": self.background_tasks(),
            "max_queue_depth": self.max_queue_depth,
            "chat_endpoint": self._chat_endpoint(),
        }

    def _probe_task(self) -> Path:
        if self.template_task is not None:
            return self.template_task
        found = sorted(p for p in self.tasks_dir.iterdir() if _is_task_dir(p))
        if not found:
            raise PlacementError(f"no Harbor task under {self.tasks_dir} to build a probe image")
        return found[0]

    async def probe_chat_endpoint(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Probe how this backend's sandboxes reach the bridge; ``None`` (404) unless in-sandbox.

        Builds (or finds) the sandbox image, runs the probe ladder over the request's
        candidates from a sandbox of that image, and keeps the route it found.
        """
        if self.workflow_spec is None:
            return None
        environment = self._probe_task() / "environment"
        return await self._placement.answer(request, self.workflow_spec.project_dir, environment)

    def _start_warm_up(self) -> None:
        if self._warming or not self._warm_up_early:
            return
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return  # not called by a server (no trio run): nothing to start
        self._warming = True
        trio.lowlevel.spawn_system_task(self._warm_up)

    async def _warm_up(self) -> None:
        """Start the Harbor worker and build the template task's image before the first row
        arrives; a trial that comes meanwhile waits for the same start (the worker's lock, the
        image's lock), and anything that fails here is tried again, and reported, by it."""
        try:
            harbor = find_harbor(self.harbor_command)
            worker = self._harbor_worker(harbor)
            if worker is not None:
                await worker.start()
            template = self.template_task if self.workflow_spec is None else None
            if self._task_images is not None and template is not None:
                await self._task_images.image_for(template)
        except Exception as exc:
            logger.debug("harbor: early start-up left to the first trial (%s)", exc)

    def has_capacity(self) -> bool:
        """False once ``max_queue_depth`` rollouts wait for a trial slot."""
        return self._queued < self.max_queue_depth

    def background_tasks(self) -> int:
        """Trials whose result is answered and whose containers are still being removed."""
        return self._teardowns.in_flight if self._teardowns is not None else 0

    def _task_for(self, request: ExecutionRequest) -> Path:
        if self.template_task is not None:
            return self.template_task
        name = (request.metadata or {}).get("harbor_task")
        if not isinstance(name, str) or not name:
            raise ValueError("dataset mode: the row's metadata must name its 'harbor_task'")
        path = (self.tasks_dir / name).resolve()
        if not path.is_relative_to(self.tasks_dir) or not _is_task_dir(path):
            raise ValueError(f"harbor_task {name!r} is not a task under {self.tasks_dir}")
        return path

    def _secrets(self, bearer: str | None) -> list[str]:
        values = [bearer] if bearer else []
        for name, value in os.environ.items():
            if value and (name in self.secret_env or _SECRET_NAME.search(name)):
                values.append(value)
        return values

    def _stage(
        self,
        request: ExecutionRequest,
        chat_url: str,
        sandbox: SandboxTrial | None = None,
        image: str | None = None,
    ) -> StagedTrial:
        """Stage the task privately (owner file first) and write the trial config."""
        service: dict[str, Any] = {
            "labels": {
                containers.TRIAL_LABEL: f"trial-{request.id}",
                containers.OWNER_LABEL: self._owner,
            }
        }
        if self.init:
            # PID 1 `sleep infinity` ignores SIGTERM; an init cuts ~10 s off every teardown.
            service["init"] = True
        if sandbox is not None and sandbox.wiring.network_mode is not None:
            service["network_mode"] = sandbox.wiring.network_mode
        instruction = prompt_text(request.prompt) if self.template_task is not None else None
        staged = stage_trial(
            self.trials_root,
            request.id,
            self._task_for(request),
            owner=self._owner,
            instruction=instruction,
            service=service,
        )
        if image is not None:
            use_task_image(staged.task_dir, image)
        harness: dict[str, Any] | None = None
        verify = True
        if self.workflow_spec is not None and sandbox is not None:
            harness, verify = stage_workflow(
                staged.task_dir, self.workflow_spec, request, sandbox.image, sandbox.package
            )
        note = timeout_note(
            self._timeouts_noted,
            self._task_for(request).name,
            staged.task_dir,
            request.agent_timeout_sec,
        )
        if note is not None:
            logger.warning(note)
        config = trial_config(
            request,
            staged.task_dir,
            trials_root=self.trials_root,
            agent=self.agent,
            agent_kwargs={**self.agent_kwargs, **(harness or {})},
            model_name=self.model_name,
            chat_url=chat_url,
            environment={
                "type": self.environment_type,
                "kwargs": dict(self.environment_kwargs),
                "extra_docker_compose": [
                    str(p) for p in (*self.extra_docker_compose, staged.overlay)
                ],
            },
            timeout_grace=_HARNESS_GRACE_S if harness is not None else 0.0,
            verify=verify,
        )
        write_private(staged.config, json.dumps(config, indent=2).encode())
        return staged

    def _child_env(
        self,
        harbor: list[str],
        bearer: str | None,
        chat_url: str,
        *,
        trial: str | None = None,
        wiring: TrialWiring | None = None,
    ) -> dict[str, str]:
        env = self._harbor_env(harbor)
        if wiring is not None:
            chat_url = wiring.chat_url
            env.update(wiring.harbor_env(trial or "", self.engine or "", env.get("PYTHONPATH")))
        if self.uses_chat_endpoint and bearer:
            env["OPENAI_API_KEY"] = bearer
            env["OPENAI_BASE_URL"] = chat_url
        return installed_env(env, self.agent, bearer)

    # -- execution ---------------------------------------------------------------------------

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Wait for a trial slot, run the trial, archive it, report its outcome."""
        ctx = get_rollout_context()
        bearer = ctx.api_key if ctx is not None else None
        chat_url = ctx.chat_completions_url if ctx is not None else ""
        if self.uses_chat_endpoint and not chat_url:
            return failed(
                f"rollout {request.id!r} has no chat_completions_url; refusing to run "
                f"{self.agent!r} without the bridge endpoint",
                RolloutErrorCategory.VALIDATION_ERROR,
            )
        self._queued += 1
        try:
            if self._teardowns is not None:
                # The same rollout id again: its previous containers must be gone first.
                await self._teardowns.wait_for(f"trial-{request.id}")
            await self._slots.acquire()
        finally:
            self._queued -= 1
        self._running += 1
        try:
            return await self._run_trial(request, bearer, chat_url)
        finally:
            self._running -= 1
            self._slots.release()

    async def _run_trial(
        self, request: ExecutionRequest, bearer: str | None, chat_url: str
    ) -> ExecutionOutcome:
        sandbox: SandboxTrial | None = None
        clock = TrialClock(request.id, f"trial-{request.id}")
        clock.mark("slot")
        try:
            harbor = find_harbor(self.harbor_command)
            if self.workflow_spec is not None:
                sandbox = await self._placement.sandbox_trial(
                    self.workflow_spec.project_dir, self._task_for(request), chat_url
                )
            image = None
            if self._task_images is not None and sandbox is None:
                image = await self._task_images.image_for(self._task_for(request))
            staged = await trio.to_thread.run_sync(self._stage, request, chat_url, sandbox, image)
            clock.mark("staged")
        except (HarborSetupError, PlacementError, ValueError, OSError) as exc:
            shutil.rmtree(self.trials_root / "staging" / request.id, ignore_errors=True)
            category = (
                RolloutErrorCategory.VALIDATION_ERROR
                if isinstance(exc, ValueError)
                else RolloutErrorCategory.INTERNAL_ERROR
            )
            return failed(str(exc), category)
        trial_name = f"trial-{request.id}"
        trial_dir = self.trials_root / "trials" / trial_name
        log_path = staged.log
        secrets = self._secrets(bearer)
        handed_off = False
        try:
            if self.engine is not None:
                await containers.sweep_trial(self.engine, trial_name)
            clock.mark("swept")
            env = self._child_env(
                harbor,
                bearer,
                chat_url,
                trial=trial_name,
                wiring=sandbox.wiring if sandbox is not None else None,
            )
            if self._teardowns is not None:
                env[DEFER_DOWN_ENV] = str(os.getpid())  # deferred while this server lives
            env[REPORTS_ENV] = str(staged.reports)
            returncode = await run_trial_process(
                harbor,
                staged.config,
                log_path,
                env,
                trial_dir,
                grace=self.cancel_grace_sec,
                engine=self.engine,
                worker=self._harbor_worker(harbor),
                # Harbor would poll a container that exited for 90 s; the shim says so at once.
                stop_when=lambda: container_gone(staged.reports),
            )
            clock.mark("exited")
            evidence = sandbox.evidence() if sandbox is not None else None
            outcome = trial_outcome(trial_dir, request, returncode, log_path, secrets, evidence)
            gone = container_exit(staged.reports, secrets)
            if gone is not None and outcome.reported().status != RolloutStatus.SUCCESS:
                logger.warning("rollout %s: %s", request.id, gone.reason())
                outcome = container_exit_outcome(gone, {"harbor_trial": trial_name})
            else:
                outcome = with_verifier_detail(outcome, trial_dir, staged.reports, secrets)
            for phase in (outcome.workflow, outcome.grader):
                if phase is not None and phase.err_message:
                    # The user knows the task by its own path, not by the staged copy's.
                    phase.err_message = phase.err_message.replace(
                        str(staged.task_dir), str(self._task_for(request))
                    )
            clock.mark("outcome")
            if request.rollout_dir is not None:
                report = await trio.to_thread.run_sync(
                    archive_trial, trial_dir, log_path, request.rollout_dir, secrets
                )
                clock.mark("archived")
                # The archive holds what the Harbor dir held, scrubbed, whatever the outcome:
                # only files it could not take (a symlink, an unscrubbable or huge file) keep
                # the dir, or the user's wish to keep every trial's.
                keep = not (self.cleanup_successful_trials and report.complete)
                if report.dropped:
                    logger.warning(
                        "rollout %s: %d trial file(s) not archived (unreadable or unscrubbable); "
                        "the Harbor trial dir is kept, scrubbed, at %s",
                        request.id,
                        len(report.dropped),
                        trial_dir,
                    )
            else:
                keep = True
            await trio.to_thread.run_sync(retire_trial_dir, trial_dir, keep, secrets)
            clock.mark("retired")
            if self._teardowns is not None:
                # Answered now; the containers and the staging dir go in the background.
                await self._teardowns.hand_off(trial_name, staged.staging, clock)
                handed_off = True
            return outcome
        finally:
            with trio.CancelScope(shield=True):
                if not handed_off:
                    if self._teardowns is not None and self.engine is not None:
                        # Harbor left its final `down` to the backend.
                        await containers.sweep_trial(self.engine, trial_name, volumes=True)
                    await trio.to_thread.run_sync(shutil.rmtree, staged.staging, True)
                clock.mark("done")
                clock.flush()

    def _harbor_env(self, harbor: list[str]) -> dict[str, str]:
        """The environment of Harbor's processes: quiet, its venv's ``bin`` (podman-compose)
        on PATH, the compose shim before it when ``fast_exec``."""
        env = dict(os.environ)
        env.update(_QUIET_ENV)
        env.pop("VIRTUAL_ENV", None)
        path = [str(Path(harbor[0]).parent), env.get("PATH", "")]
        if self._fast_exec and self._shim_dir is None:
            try:
                self._shim_dir = install_compose_shim(self.trials_root, Path(harbor[0]).parent)
            except OSError as exc:
                logger.warning("harbor: no fast exec path (%s)", exc)
            if self._shim_dir is None:
                self._fast_exec = False
        if self._shim_dir is not None:
            path.insert(0, str(self._shim_dir))
        env["PATH"] = os.pathsep.join(path)
        return env

    def _harbor_worker(self, harbor: list[str]) -> HarborWorker | None:
        """The long-lived Harbor worker (created on first use), or None when not used."""
        if not self._use_worker:
            return None
        if self._worker is None:
            python = harbor_python(harbor)
            if python is None:
                self._use_worker = False
                return None
            self._worker = HarborWorker(python, self._harbor_env(harbor), self.cancel_grace_sec)
        return self._worker

    async def shutdown(self) -> None:
        """Wait for the background teardowns, stop the Harbor worker, remove any container this
        server still owns (every trial has been cancelled)."""
        if self._teardowns is not None:
            with trio.move_on_after(_TEARDOWN_WAIT_S):
                await self._teardowns.aclose()
        if self._worker is not None:
            await self._worker.aclose()
        if self.engine is None or not shutil.which(self.engine):
            return
        with trio.move_on_after(60):
            owned = await trio.to_thread.run_sync(
                containers.orphan_trials, self.engine, self._owner
            )
            ids = [cid for found in owned.values() for cid in found]
            if ids:
                await trio.to_thread.run_sync(
                    containers.remove_trials, self.engine, ids, sorted(owned)
                )
