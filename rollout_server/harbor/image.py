"""The sandbox image: a task's ``environment/`` image plus the rollout's bundle installed offline.

:func:`ensure_image` builds ``localhost/rollbridge-sandbox:<digest16>`` from a temp copy of the
task's ``environment/`` (its Dockerfile and context) with a ``rollbridge-bundle/`` directory
added (the wheels, uv, an install script) and a generated Dockerfile: the task's own, then one
``RUN`` that bind-mounts ``rollbridge-bundle/`` (so neither the wheels nor the 40 MB uv binary
stay in a layer), creates ``/opt/rollbridge/venv`` with the image's ``python3`` and installs the
bundle into it with the bundled uv, ``--no-index``. The whole build runs with ``--network none``. The digest covers the
environment's files and the bundle's digest, so the image is built once per (task environment,
bundle) and found again with ``<engine> image inspect``.

podman-compose removes a ``localhost/...`` image used as a compose ``image:`` at teardown, so a
trial does not use the tag directly: it builds :func:`trial_dockerfile` (``FROM <tag>``), whose
teardown removes only the trial's own tag.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .wheelhouse import BundleError, file_sha256

if TYPE_CHECKING:
    from .bundle import Bundle

__all__ = [
    "IMAGE_REPOSITORY",
    "SANDBOX_LABEL",
    "SandboxImage",
    "build_containers",
    "ensure_image",
    "remove_new_build_containers",
    "trial_dockerfile",
]

IMAGE_REPOSITORY = "localhost/rollbridge-sandbox"
#: ``=1`` on every sandbox image this module builds (``=trial`` on a trial's image built on one).
SANDBOX_LABEL = "io.rollbridge.sandbox"
VENV = "/opt/rollbridge/venv"
_BUNDLE_IN_IMAGE = "/opt/rollbridge/bundle"
_CONTEXT_DIR = "rollbridge-bundle"
_IMAGE_FORMAT = 1
_MARK = "rollbridge-install:"
_NOISE = re.compile(
    r"^(STEP \d+/\d+|--> |COMMIT |Getting image source|Copying (blob|config)|Writing manifest|"
    r"Storing signatures|Successfully|time=)"
)


@dataclass(frozen=True)
class SandboxImage:
    """A built sandbox image."""

    tag: str
    digest: str
    #: The image venv's Python (``3.11.2``).
    python_version: str


def trial_dockerfile(image: SandboxImage, trial: str = "") -> str:
    """The one-stage Dockerfile a trial's ``environment/`` gets instead of the task's: ``FROM`` the
    sandbox image, relabelled so sweeps of sandbox images (``io.rollbridge.sandbox=1``) skip it.

    The trial's name is a label too, so no two trials' builds share a cached layer: with one,
    a trial whose build hit the cache lost its image when another trial's teardown removed
    the last name of that layer ("getting source imageReference ... cannot specify 64-byte
    hexadecimal strings"), seen with trials of two servers (Ray replicas) on one engine."""
    labels = f'{SANDBOX_LABEL}="trial" {SANDBOX_LABEL}.base="{image.tag}"'
    if trial:
        labels += f' {SANDBOX_LABEL}.trial="{trial}"'
    return f"FROM {image.tag}\nLABEL {labels}\n"


def _tree_files(root: Path) -> list[str]:
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            full = Path(dirpath, name)
            if full.is_file():
                names.append(full.relative_to(root).as_posix())
    return names


def _image_digest(environment_dir: Path, bundle: Bundle, manifest: dict[str, Any]) -> str:
    """Over the recipe (generated Dockerfile, install script), the bundle and the environment."""
    task_dockerfile = (environment_dir / "Dockerfile").read_text(encoding="utf-8")
    h = hashlib.sha256()
    h.update(f"image-format {_IMAGE_FORMAT}\nbundle {bundle.digest}\n".encode())
    h.update(_generated_dockerfile(task_dockerfile, bundle.digest, "").encode())
    h.update(_install_script(bundle, manifest).encode())
    for name in _tree_files(environment_dir):
        h.update(
            f"file {name} {file_sha256(environment_dir / name)}\n".encode(
                "utf-8", "surrogateescape"
            )
        )
    return h.hexdigest()


def _manifest(bundle: Bundle) -> dict[str, Any]:
    try:
        document = json.loads((bundle.directory / "manifest.json").read_bytes())
    except (OSError, ValueError) as exc:
        raise BundleError(
            f"bundle {bundle.directory} has no readable manifest.json ({exc}); rebuild it"
        ) from exc
    if not isinstance(document, dict):
        raise BundleError(f"bundle {bundle.directory} has a malformed manifest.json; rebuild it")
    return document


def _install_script(bundle: Bundle, manifest: dict[str, Any]) -> str:
    """The install layer's shell script (run with ``/bin/sh`` in the image)."""
    mm = str(manifest.get("python", ""))
    platform = [w["file"] for w in manifest.get("wheels", []) if not w.get("pure", False)]
    check = ""
    if platform and mm:
        check = f'case "$V" in {mm}|{mm}.*) ;; *) echo "{_MARK} python-mismatch $V" >&2; exit 42;; esac\n'
    return (
        "set -eu\n"
        f"B={_BUNDLE_IN_IMAGE}\n"
        'PY="$(command -v python3 || true)"\n'
        f'if [ -z "$PY" ]; then echo "{_MARK} no-python3" >&2; exit 41; fi\n'
        'V="$("$PY" -c \'import sys; print("%d.%d.%d" % sys.version_info[:3])\')"\n'
        f'echo "{_MARK} python $V"\n'
        f"{check}"
        "export UV_PYTHON_DOWNLOADS=never UV_NO_CACHE=1 UV_OFFLINE=1 UV_LINK_MODE=copy\n"
        f'"$B/uv" venv --quiet --python "$PY" {VENV}\n'
        f'"$B/uv" pip install --quiet --python {VENV}/bin/python --no-index --find-links "$B/wheels" '
        f'--compile-bytecode "{bundle.requirement}"\n'
        f'echo "$V" > /opt/rollbridge/python-version\n'
    )


def _last_user(dockerfile: str) -> str | None:
    user = None
    for line in dockerfile.splitlines():
        match = re.match(r"^\s*USER\s+(\S.*?)\s*$", line, re.IGNORECASE)
        if match:
            user = match.group(1)
    return user


def _generated_dockerfile(task_dockerfile: str, bundle_digest: str, digest: str) -> str:
    """The task's Dockerfile + the install layer. The bundle's digest is an argument of the RUN
    line because the builder's layer cache keys on the instruction, not on what it mounts."""
    user = _last_user(task_dockerfile)
    lines = [
        task_dockerfile.rstrip("\n"),
        "",
        "# rollbridge: the rollout's bundle, installed offline",
    ]
    if user is not None:
        lines.append("USER root")
    lines += [
        f"RUN --mount=type=bind,source={_CONTEXT_DIR},target={_BUNDLE_IN_IMAGE} "
        f'["/bin/sh", "{_BUNDLE_IN_IMAGE}/install.sh", "{bundle_digest}"]',
        f'LABEL {SANDBOX_LABEL}="1" {SANDBOX_LABEL}.digest="{digest}"',
    ]
    if user is not None:
        lines.append(f"USER {user}")
    return "\n".join(lines) + "\n"


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _prepare_context(
    environment_dir: Path, bundle: Bundle, manifest: dict[str, Any], digest: str
) -> Path:
    """A temp dir holding ``context/`` (the environment + the bundle) and ``Dockerfile``."""
    work = Path(tempfile.mkdtemp(dir=bundle.directory.parent, prefix=".image-"))
    context = work / "context"
    shutil.copytree(environment_dir, context, symlinks=True)
    staged = context / _CONTEXT_DIR
    (staged / "wheels").mkdir(parents=True)
    for wheel in manifest.get("wheels", []):
        _link_or_copy(
            bundle.directory / "wheels" / wheel["file"], staged / "wheels" / wheel["file"]
        )
    _link_or_copy(bundle.directory / "uv", staged / "uv")
    (staged / "install.sh").write_text(_install_script(bundle, manifest))
    for ignore in (".dockerignore", ".containerignore"):
        if (context / ignore).is_file():
            with (context / ignore).open("a") as handle:
                handle.write(f"\n!{_CONTEXT_DIR}\n!{_CONTEXT_DIR}/**\n")
    task_dockerfile = (environment_dir / "Dockerfile").read_text(encoding="utf-8")
    (work / "Dockerfile").write_text(_generated_dockerfile(task_dockerfile, bundle.digest, digest))
    return work


def _meaningful(output: str, count: int = 3) -> str:
    lines = [
        ln.strip() for ln in output.splitlines() if ln.strip() and not _NOISE.match(ln.strip())
    ]
    return " | ".join(lines[-count:]) or "(no output)"


def _failure(output: str, manifest: dict[str, Any], environment_dir: Path) -> BundleError:
    mm = str(manifest.get("python", "?"))
    if f"{_MARK} no-python3" in output:
        return BundleError(
            f"the task image built from {environment_dir}/Dockerfile has no python3 on PATH; "
            f"install python3 ({mm}) in that Dockerfile"
        )
    mismatch = re.search(rf"{_MARK} python-mismatch (\S+)", output)
    if mismatch:
        found = mismatch.group(1)
        found_mm = ".".join(found.split(".")[:2])
        wheel = next((w["file"] for w in manifest.get("wheels", []) if not w.get("pure")), "?")
        return BundleError(
            f"the rollout venv runs Python {mm} but the task image's python3 is {found}, and "
            f"{wheel} is platform-specific (built for {mm}); pin the rollout environment to "
            f"Python {found_mm} (a .python-version file or requires-python) and re-sync, or "
            f"install python{mm} in {environment_dir}/Dockerfile"
        )
    return BundleError(f"building the sandbox image failed: {_meaningful(output)}")


def _sidecar(bundle: Bundle, digest: str) -> Path:
    return bundle.directory.parent / ".images" / f"{digest[:16]}.json"


async def _run(argv: list[str]) -> tuple[int, str]:
    try:
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False, stdin=b""
        )
    except OSError as exc:
        raise BundleError(
            f"cannot run {argv[0]}: {exc}; install it or pick another engine"
        ) from exc
    text = done.stdout.decode("utf-8", "replace") + "\n" + done.stderr.decode("utf-8", "replace")
    return done.returncode, text


async def build_containers(engine: str) -> set[str]:
    """The ids of the engine's build containers (buildah's "working containers", which podman
    lists as external ones); empty for an engine without them."""
    rc, output = await _run([engine, "ps", "--all", "--external", "--format", "{{.ID}} {{.Names}}"])
    if rc != 0:
        return set()
    return {
        line.split()[0]
        for line in output.splitlines()
        if len(line.split()) == 2 and "-working-container" in line.split()[1]
    }


async def remove_new_build_containers(engine: str, before: set[str]) -> None:
    """Remove the build containers that appeared since ``before``: a build killed by a
    Ctrl-C (SIGTERM or SIGINT alike) leaves its working containers behind, listed only with
    ``--external``, never reaped. (One of another build started meanwhile would go too; that
    build then fails and says so.)"""
    new = sorted(await build_containers(engine) - before)
    if new:
        await _run([engine, "rm", "--force", *new])


async def _cached_python(engine: str, tag: str, sidecar: Path) -> str:
    try:
        return str(json.loads(await trio.Path(sidecar).read_bytes())["python_version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rc, text = await _run(
        [
            engine,
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "cat",
            tag,
            "/opt/rollbridge/python-version",
        ]
    )
    return text.strip().splitlines()[0] if rc == 0 and text.strip() else ""


async def ensure_image(
    engine: str,
    environment_dir: Path,
    bundle: Bundle,
    *,
    log: Callable[[str], None] | None = None,
) -> SandboxImage:
    """The sandbox image of the task environment ``environment_dir`` (its ``Dockerfile`` and
    context) with ``bundle`` installed: found by tag, else built with ``<engine> build --network
    none``. Raises :class:`BundleError` (one line) when it cannot be built."""
    emit = log or (lambda _line: None)
    environment_dir = Path(environment_dir)
    if not (environment_dir / "Dockerfile").is_file():
        raise BundleError(
            f"{environment_dir} has no Dockerfile; an in-sandbox agent needs the task's "
            "environment/Dockerfile to build its image"
        )
    manifest = await trio.to_thread.run_sync(_manifest, bundle)
    digest = await trio.to_thread.run_sync(_image_digest, environment_dir, bundle, manifest)
    tag = f"{IMAGE_REPOSITORY}:{digest[:16]}"
    sidecar = _sidecar(bundle, digest)
    rc, _ = await _run([engine, "image", "inspect", "--format", "{{.Id}}", tag])
    if rc == 0:
        return SandboxImage(tag, digest, await _cached_python(engine, tag, sidecar))
    started = time.monotonic()
    emit(f"sandbox image {tag}: building (bundle {bundle.digest[:12]}, network none)")
    work = await trio.to_thread.run_sync(
        _prepare_context, environment_dir, bundle, manifest, digest
    )
    before = await build_containers(engine)
    built = False
    try:
        rc, output = await _run(
            [
                engine,
                "build",
                "--network",
                "none",
                "-t",
                tag,
                "-f",
                str(work / "Dockerfile"),
                str(work / "context"),
            ]
        )
        built = rc == 0
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: shutil.rmtree(work, ignore_errors=True))
            if not built:  # cancelled (a Ctrl-C) or failed: podman leaves its working containers
                with trio.move_on_after(30), contextlib.suppress(BundleError):
                    await remove_new_build_containers(engine, before)
    if rc != 0:
        raise _failure(output, manifest, environment_dir)
    found = re.search(rf"{_MARK} python (\S+)", output)
    python_version = found.group(1) if found else await _cached_python(engine, tag, sidecar)
    await trio.to_thread.run_sync(_write_sidecar, sidecar, tag, python_version)
    emit(
        f"sandbox image {tag}: built in {time.monotonic() - started:.1f} s (python {python_version})"
    )
    return SandboxImage(tag, digest, python_version)


def _write_sidecar(sidecar: Path, tag: str, python_version: str) -> None:
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    temp = sidecar.with_suffix(f".{os.getpid()}.tmp")
    temp.write_text(json.dumps({"tag": tag, "python_version": python_version}))
    os.replace(temp, sidecar)
