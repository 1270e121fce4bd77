"""The trial archive: scrubbed copies of a Harbor trial's evidence under the rollout's dir.

Layout under ``<run>/rollout_trials/<rollout_id>/``::

    harbor/               result.json, config.json, trial.log, exception.txt, agent/, verifier/,
                          steps/ (all scrubbed) and manifest.json (path, size_bytes, sha256)
    artifacts/            the trial's collected artifacts (scrubbed)
    logs/harbor.log       the Harbor process's own output (scrubbed)

Every retained file has every spelling of every secret replaced by ``[REDACTED]`` before it is
written (the project's one policy, :class:`rollout_server.net.secrets.SecretMatcher`: as is,
stripped, JSON- and repr-escaped at any depth, URL-encoded), and is re-read to confirm none is
left; a file that cannot be read, is too large, is a
symlink or still holds a secret is not kept (fail-closed) and is listed under ``dropped``.
Directories are 0700 and files 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollout_server.net.secrets import SecretMatcher

__all__ = [
    "KEPT_MARK",
    "REDACTED",
    "ArchiveReport",
    "archive_trial",
    "log_tail",
    "retire_trial_dir",
    "scrub_bytes",
    "secret_spellings",
]

REDACTED = b"[REDACTED]"
#: Left in a trial dir kept on purpose (its archive is incomplete, or the backend keeps every
#: trial's): the start-up reaper removes any other trial dir that no staged trial owns.
KEPT_MARK = ".rollbridge-kept"
MANIFEST_SCHEMA = "rollbridge-harbor-evidence-v1"
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Shorter values would redact ordinary text and protect nothing.
MIN_SECRET_LENGTH = 4
_HARBOR_ARTIFACT_MANIFEST = "artifacts/manifest.json"
_EVIDENCE = (
    "result.json",
    "config.json",
    "trial.log",
    "exception.txt",
    "agent",
    "verifier",
    "steps",
)


def secret_spellings(secrets: Iterable[str]) -> SecretMatcher:
    """Every spelling of each secret (at least :data:`MIN_SECRET_LENGTH` long) that a
    retained file may contain, as the project's one matcher."""
    matcher = SecretMatcher()
    for secret in secrets:
        matcher.add(secret, min_length=MIN_SECRET_LENGTH)
    return matcher


def scrub_bytes(data: bytes, spellings: SecretMatcher) -> bytes | None:
    """``data`` with every spelling redacted, or ``None`` if one survives (fail-closed)."""
    clean = spellings.sub_bytes(REDACTED, data)
    if spellings.found_bytes(clean):
        return None
    return clean


@dataclass
class ArchiveReport:
    """What :func:`archive_trial` kept and dropped (paths relative to the rollout dir)."""

    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when nothing had to be dropped."""
        return not self.dropped


def _mkdir_private(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes) -> None:
    _mkdir_private(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _read_regular(path: Path) -> bytes | None:
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None


def _walk(root: Path) -> Iterable[Path]:
    """Files under ``root`` (or ``root`` itself), without following symlinked directories."""
    if root.is_symlink() or not root.is_dir():
        if root.exists() or root.is_symlink():
            yield root
        return
    for dirpath, _dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(filenames):
            yield Path(dirpath) / name


def _copy_scrubbed(
    source: Path, target: Path, spellings: SecretMatcher, rel: str, report: ArchiveReport
) -> tuple[int, str] | None:
    data = _read_regular(source)
    clean = (
        scrub_bytes(data, spellings) if data is not None and len(data) <= MAX_FILE_BYTES else None
    )
    if clean is None:
        report.dropped.append(rel)
        return None
    try:
        _write_private(target, clean)
        written = _read_regular(target)
    except OSError:
        written = None
    if written is None or scrub_bytes(written, spellings) != written:
        target.unlink(missing_ok=True)
        report.dropped.append(rel)
        return None
    report.kept.append(rel)
    return len(clean), hashlib.sha256(clean).hexdigest()


def archive_trial(
    trial_dir: Path, process_log: Path | None, dest: Path, secrets: Iterable[str]
) -> ArchiveReport:
    """Copy the scrubbed evidence of ``trial_dir`` (and the Harbor ``process_log``) to ``dest``.

    Replaces an earlier archive of the same rollout (a resumed run reuses the id). Blocking;
    run it in a thread.
    """
    spellings = secret_spellings(secrets)
    report = ArchiveReport()
    for stale in ("harbor", "artifacts", "logs"):
        shutil.rmtree(dest / stale, ignore_errors=True)
    _mkdir_private(dest)
    entries: list[dict[str, object]] = []
    for name in _EVIDENCE:
        for source in _walk(trial_dir / name):
            rel = source.relative_to(trial_dir).as_posix()
            copied = _copy_scrubbed(
                source, dest / "harbor" / rel, spellings, f"harbor/{rel}", report
            )
            if copied is not None:
                entries.append({"path": rel, "size_bytes": copied[0], "sha256": copied[1]})
    for source in _walk(trial_dir / "artifacts"):
        rel = source.relative_to(trial_dir).as_posix()
        if rel == _HARBOR_ARTIFACT_MANIFEST:
            # Harbor's record of what it collected is evidence; the supervisor reserves the name
            # artifacts/manifest.json for its own.
            copied = _copy_scrubbed(
                source, dest / "harbor" / rel, spellings, f"harbor/{rel}", report
            )
            if copied is not None:
                entries.append({"path": rel, "size_bytes": copied[0], "sha256": copied[1]})
            continue
        _copy_scrubbed(source, dest / rel, spellings, rel, report)
    if process_log is not None and (process_log.exists() or process_log.is_symlink()):
        _copy_scrubbed(
            process_log, dest / "logs" / "harbor.log", spellings, "logs/harbor.log", report
        )
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "trial": trial_dir.name,
        "files": entries,
        "dropped": [rel for rel in report.dropped if rel.startswith("harbor/")],
    }
    _write_private(dest / "harbor" / "manifest.json", json.dumps(manifest, indent=2).encode())
    return report


def log_tail(log_path: Path, secrets: Sequence[str], lines: int = 5) -> str:
    """The last ``lines`` lines of a Harbor log, scrubbed of ``secrets`` (for error messages)."""
    try:
        data = log_path.read_bytes()[-4000:]
    except OSError:
        return "(no Harbor output)"
    clean = scrub_bytes(data, secret_spellings(secrets))
    if clean is None:
        return "(Harbor output withheld: it could not be scrubbed)"
    return " | ".join(clean.decode(errors="replace").strip().splitlines()[-lines:])


def retire_trial_dir(trial_dir: Path, keep: bool, secrets: Sequence[str]) -> None:
    """Delete the trial dir, or keep it for debugging with every secret scrubbed in place and
    :data:`KEPT_MARK` in it."""
    if not keep:
        shutil.rmtree(trial_dir, ignore_errors=True)
        return
    spellings = secret_spellings(secrets)
    try:
        if trial_dir.is_dir():
            _write_private(trial_dir / KEPT_MARK, b"kept on purpose; remove it with the dir\n")
        if not spellings.values:
            return
        for dirpath, _dirs, files in os.walk(trial_dir, followlinks=False):
            for name in files:
                path = Path(dirpath) / name
                data = None if path.is_symlink() else path.read_bytes()
                clean = scrub_bytes(data, spellings) if data is not None else None
                if clean is None:
                    path.unlink()
                elif clean != data:
                    path.write_bytes(clean)
    except OSError:
        # Fail closed: a tree that cannot be scrubbed is not kept.
        shutil.rmtree(trial_dir, ignore_errors=True)
