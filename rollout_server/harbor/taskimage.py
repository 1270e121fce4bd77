"""A task environment's image, built once and reused by every trial of the task.

Harbor builds a task's ``environment/Dockerfile`` in every trial (through podman-compose: a few
seconds of CPU each) and removes the image at teardown. When the backend runs many trials of the
same task, it builds the image once, as ``localhost/rollbridge-task/<task>:<digest16>`` (the
digest covers every file of ``environment/``), and each staged trial's ``task.toml`` names it as
``[environment] docker_image``, so Harbor starts the container from it without a build.

The trial names it without the ``localhost/`` prefix: podman-compose's teardown removes an
``image:`` it counts as local (``localhost/...``, or built), and this image must outlive the
trial. It is a cache like the sandbox images (:mod:`.image`): labelled
``io.rollbridge.task-image=1``, found again by tag, never per trial, so reaping a trial's
leftovers never touches it.

Only tasks whose ``environment/`` has a ``Dockerfile`` and no compose file of its own, and whose
``task.toml`` names no ``docker_image``, are prebuilt; any other task is left to Harbor.

A build that fails (a base image that is not here, a ``RUN`` that exits non-zero, the build's
time limit) is remembered for the server's life under the same digest: every row of that task
then fails at once with :class:`TaskImageError`, whose one-line message starts with the cause
(``task image build failed: <podman's error line> (last output: <the step's last line>)``),
instead of Harbor building it again, and failing the same way, in every trial. The build's
whole output goes to the log once. An edit of ``environment/`` is a new digest, built afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import tomllib
from pathlib import Path

import trio

from .image import _tree_files, build_containers, remove_new_build_containers
from .locate import HarborSetupError
from .wheelhouse import BundleError, file_sha256

__all__ = [
    "TASK_IMAGE_LABEL",
    "TaskImageError",
    "TaskImages",
    "build_failure_cause",
    "prebuildable",
    "use_task_image",
]

logger = logging.getLogger("rollout_server.harbor")

TASK_IMAGE_LABEL = "io.rollbridge.task-image"
_REPOSITORY = "rollbridge-task"
_FORMAT = 1
_ENV_HEADER = re.compile(r"^\[environment\][ \t]*(#.*)?$", re.MULTILINE)
_BUILD_TIMEOUT_S = 600.0
#: Build output that is progress, not a cause: step headers, cache hits, commits, and podman's
#: own retry warnings (``time=... level=warning``), which repeat the final error.
_NOISE = re.compile(
    r"^(STEP \d+/\d+|--> |COMMIT |Getting image source|Copying (blob|config)|Writing manifest|"
    r"Storing signatures|Successfully|Trying to pull|time=|[0-9a-f]{64}$)"
)
_CAUSE_CHARS = 400


class TaskImageError(HarborSetupError):
    """A task's image could not be built; every later row of the task fails with the same."""


def build_failure_cause(output: str) -> str:
    """One line saying why a build failed: podman's ``Error:`` line, with the last line the
    failing step printed before it (a ``RUN`` step's own complaint), bounded."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not _NOISE.match(ln)]
    errors = [i for i, ln in enumerate(lines) if ln.startswith("Error:")]
    if not errors:
        cause = lines[-1] if lines else "the build printed nothing"
    else:
        at = errors[0]
        cause = lines[at].removeprefix("Error:").strip()
        if at > 0:
            cause += f" (last output: {lines[at - 1]})"
    return cause if len(cause) <= _CAUSE_CHARS else cause[: _CAUSE_CHARS - 1] + "…"


def _task_doc(task_dir: Path) -> dict[str, object] | None:
    try:
        return tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def prebuildable(task_dir: Path) -> bool:
    """Whether the task's environment is one plain ``Dockerfile`` that Harbor would build."""
    env = task_dir / "environment"
    doc = _task_doc(task_dir)
    if doc is None or not (env / "Dockerfile").is_file():
        return False
    if any((env / name).exists() for name in ("docker-compose.yaml", "docker-compose.yml")):
        return False
    table = doc.get("environment")
    return not (isinstance(table, dict) and table.get("docker_image"))


def _digest(env: Path) -> str:
    h = hashlib.sha256(f"task-image {_FORMAT}\n".encode())
    for name in _tree_files(env):
        h.update(f"file {name} {file_sha256(env / name)}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _slug(task_dir: Path) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", task_dir.name.lower()).strip("-._")
    return slug or "task"


def use_task_image(task_dir: Path, image: str) -> bool:
    """Point the staged task's ``task.toml`` at ``image`` (``[environment] docker_image``).

    Returns False, leaving the file as it was, when the edit would not read back as meant.
    """
    path = task_dir / "task.toml"
    text = path.read_text(encoding="utf-8")
    line = f'docker_image = "{image}"'
    found = _ENV_HEADER.search(text)
    if found is not None:
        edited = f"{text[: found.end()]}\n{line}{text[found.end() :]}"
    else:
        edited = f"{text.rstrip()}\n\n[environment]\n{line}\n"
    try:
        table = tomllib.loads(edited).get("environment")
    except tomllib.TOMLDecodeError:
        return False
    if not isinstance(table, dict) or table.get("docker_image") != image:
        return False
    path.write_text(edited, encoding="utf-8")
    return True


class TaskImages:
    """Per-server cache of built task images (one build at a time per digest), and of the
    builds that failed."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._built: dict[str, str] = {}
        self._failed: dict[str, str] = {}
        self._locks: dict[str, trio.Lock] = {}

    async def image_for(self, task_dir: Path) -> str | None:
        """The compose ``image:`` name for ``task_dir``'s environment, built if need be; None
        when the task is not prebuildable (Harbor then builds it).

        Raises :class:`TaskImageError` when the build failed, now or earlier in this server's
        life (the same cause each time; nothing is built again)."""
        if not await trio.to_thread.run_sync(prebuildable, task_dir):
            return None
        env = task_dir / "environment"
        digest = await trio.to_thread.run_sync(_digest, env)
        name = f"{_REPOSITORY}/{_slug(task_dir)}:{digest[:16]}"
        if name in self._built.values():
            return name
        lock = self._locks.setdefault(digest, trio.Lock())
        async with lock:
            if digest in self._failed:
                raise TaskImageError(self._failed[digest])
            if digest in self._built:
                return self._built[digest]
            tag = f"localhost/{name}"
            if not await self._exists(tag):
                failure = await self._build(tag, env)
                if failure is not None:
                    cause = f"task image build failed: {build_failure_cause(failure)}"
                    logger.warning(
                        "harbor: %s; building %s from %s said:\n%s", cause, tag, env, failure
                    )
                    self._failed[digest] = cause
                    raise TaskImageError(cause)
            self._built[digest] = name
            return name

    async def _exists(self, tag: str) -> bool:
        try:
            done = await trio.run_process(
                [self.engine, "image", "inspect", "--format", "{{.Id}}", tag],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        except OSError:
            return False
        return done.returncode == 0

    async def _build(self, tag: str, env: Path) -> str | None:
        """Build ``tag`` from ``env``: None when built, else what the build printed (or why it
        did not run)."""
        argv = [self.engine, "build", "-q", "--label", f"{TASK_IMAGE_LABEL}=1", "-t", tag]
        before: set[str] = set()
        with contextlib.suppress(BundleError):
            before = await build_containers(self.engine)
        built = False
        try:
            with trio.move_on_after(_BUILD_TIMEOUT_S):
                try:
                    done = await trio.run_process(
                        [*argv, str(env)], capture_stdout=True, capture_stderr=True, check=False
                    )
                except OSError as exc:
                    return f"Error: cannot run {self.engine}: {exc}"
                built = done.returncode == 0
                if built:
                    return None
                output = done.stdout + b"\n" + done.stderr
                return output.decode("utf-8", "replace")
            return f"Error: the build took longer than {_BUILD_TIMEOUT_S:g} s"
        finally:
            if not built:  # cut short or failed: podman leaves its working containers
                shield = trio.CancelScope(shield=True)
                with shield, trio.move_on_after(30), contextlib.suppress(BundleError):
                    await remove_new_build_containers(self.engine, before)
