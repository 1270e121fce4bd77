"""Rollout source digest (docs/spec/supervisor.md §4.4): the fingerprint a named run locks.

The file selection follows the reference: every regular file under ``rollouts/<rollout>``
(symlinks to files followed), excluding any path with a component in
:data:`EXCLUDED_PARTS` or matching ``uv.lock`` / ``*.egg-info``, and everything under the
output root when it lies inside the rollout. Hidden files such as ``.env`` count.

Like osmosis-ai >= 0.3.9 (§4.4), the byte format differs from 0.3.8 and is versioned: the 0.3.8
format concatenated path and content with no separator, which is ambiguous. Here each file
contributes its POSIX path, a NUL, its length in decimal, a NUL, then its bytes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path, PurePosixPath

from launcher.errors import ValidationError

__all__ = ["DIGEST_FORMAT", "EXCLUDED_GLOBS", "EXCLUDED_PARTS", "digest_files", "source_digest"]

DIGEST_FORMAT = b"rollbridge-source-digest-v1\x00"
EXCLUDED_PARTS = frozenset(
    {
        "__pycache__",
        ".git",
        ".venv",
        "venv",
        "dist",
        "build",
        "node_modules",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
    }
)
EXCLUDED_GLOBS = ("uv.lock", "*.egg-info")


def _excluded(parts: tuple[str, ...]) -> bool:
    return any(
        part in EXCLUDED_PARTS or any(fnmatch.fnmatchcase(part, g) for g in EXCLUDED_GLOBS)
        for part in parts
    )


def digest_files(rollout_dir: Path, output_root: Path | None = None) -> list[PurePosixPath]:
    """The relative paths that the digest covers, in digest order (path components order).

    Raises ValidationError for a non-excluded directory symlink or broken link, and when the
    output root is the rollout directory itself.
    """
    root = Path(rollout_dir).resolve()
    out = Path(output_root).resolve() if output_root is not None else None
    if out is not None and out == root:
        raise ValidationError(
            f"--output must not be the rollout source directory {root}: excluding the output "
            "tree would then exclude the whole project, freezing the resume fingerprint."
        )
    skip_under = out if out is not None and out.is_relative_to(root) else None
    found: list[PurePosixPath] = []
    for dirpath, dirnames, filenames in os.walk(root):
        current = Path(dirpath)
        rel_dir = current.relative_to(root).parts
        kept = []
        for name in dirnames:
            full = current / name
            if _excluded((*rel_dir, name)) or (skip_under is not None and full == skip_under):
                continue
            if full.is_symlink():
                raise ValidationError(
                    f"rollout source contains a directory or broken symlink: {full} -> "
                    f"{os.readlink(full)}; replace it with a real directory or file so the "
                    "digest can describe what it covers"
                )
            kept.append(name)
        dirnames[:] = kept
        for name in filenames:
            rel = (*rel_dir, name)
            if _excluded(rel):
                continue
            full = current / name
            if full.is_symlink() and not full.is_file():
                raise ValidationError(
                    f"rollout source contains a directory or broken symlink: {full} -> "
                    f"{os.readlink(full)}; replace it with a real directory or file so the "
                    "digest can describe what it covers"
                )
            if full.is_file():
                found.append(PurePosixPath(*rel))
    found.sort(key=lambda p: p.parts)
    return found


def source_digest(rollout_dir: Path, output_root: Path | None = None) -> str:
    """Lowercase hex SHA-256 over the selected files (see module docstring for the format)."""
    root = Path(rollout_dir).resolve()
    h = hashlib.sha256(DIGEST_FORMAT)
    for rel in digest_files(root, output_root):
        data = (root / rel).read_bytes()
        h.update(rel.as_posix().encode("utf-8") + b"\x00" + str(len(data)).encode() + b"\x00")
        h.update(data)
    return h.hexdigest()
