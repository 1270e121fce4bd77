"""Who uploads, and where: the platform URL, the token and the workspace scope, resolved as
osmosis-ai 0.3.8 resolves them (docs/upload.md, "Credentials and identity").

* Platform URL: ``OSMOSIS_PLATFORM_URL``, else ``https://platform.osmosis.ai``; plain HTTP only
  to a loopback host.
* Token: ``OSMOSIS_TOKEN`` (bound to a non-production platform by
  ``OSMOSIS_TOKEN_PLATFORM_URL``), else the entry for this platform in the reference CLI's
  ``~/.config/osmosis/credentials.json`` (a token kept in the file, or in the system keyring
  when the optional ``keyring`` package can read it). The token is only ever read here.
* Scope: ``--workspace NAME`` sends ``X-Osmosis-Workspace``; otherwise the workspace's git
  ``origin`` on github.com gives the ``X-Osmosis-Git`` identity ``owner/repo``.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from launcher.errors import CLIError
from rollout_server.net.hosts import is_loopback_host

__all__ = [
    "DEFAULT_PLATFORM_URL",
    "PROTOCOL_CLI_VERSION",
    "AuthError",
    "PlatformIdentity",
    "git_identity",
    "normalize_platform_url",
    "resolve_identity",
]

DEFAULT_PLATFORM_URL = "https://platform.osmosis.ai"
#: The CLI version whose import protocol this speaks; sent as ``X-Osmosis-CLI-Version``.
PROTOCOL_CLI_VERSION = "0.3.8"
LOGIN_HINT = "Run 'osmosis auth login' (the osmosis-ai CLI) or set OSMOSIS_TOKEN."
_KEYRING_SERVICE = "osmosis-cli"
_GITHUB_IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")
_SCP_LIKE = re.compile(r"(?P<user>[^@\s/]+)@(?P<host>[^:\s/]+):(?P<path>.+)")


class AuthError(CLIError):
    """No usable platform credentials (code ``AUTH_REQUIRED``)."""

    default_code = "AUTH_REQUIRED"


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is loopback (localhost, 127.x, ::1)."""
    try:
        return is_loopback_host((urlsplit(url).hostname or "").lower())
    except ValueError:
        return False


def normalize_platform_url(url: str | None) -> str:
    """The canonical base URL: scheme and host lower case, no default port, no trailing ``/``;
    a URL without a scheme is ``http`` on loopback and ``https`` elsewhere."""
    raw = (url or DEFAULT_PLATFORM_URL).strip().rstrip("/") or DEFAULT_PLATFORM_URL
    try:
        head = urlsplit(raw)
        if not (head.scheme and head.netloc):
            probe = urlsplit(f"//{raw}")
            raw = (
                f"{'http' if is_loopback_host((probe.hostname or '').lower()) else 'https'}://{raw}"
            )
        parsed = urlsplit(raw)
        scheme, host, port = parsed.scheme.lower(), (parsed.hostname or "").lower(), parsed.port
    except ValueError:
        raise CLIError(f"Invalid platform URL '{raw}'") from None
    if not host:
        raise CLIError(f"Invalid platform URL '{raw}'")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and (scheme, port) not in (("https", 443), ("http", 80)):
        netloc = f"{netloc}:{port}"
    return urlunsplit((scheme, netloc, parsed.path.rstrip("/"), "", ""))


@dataclass(frozen=True)
class PlatformIdentity:
    """The platform, the bearer token (never in ``repr``) and the workspace scope."""

    platform_url: str
    token: str = field(repr=False)
    git_identity: str | None
    workspace_name: str | None
    repo_url: str | None = None

    def headers(self) -> dict[str, str]:
        """The headers of every platform API request (C.5), in the reference's order."""
        from rollout_server.protocol import sdk_version

        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"rollbridge/{sdk_version()} osmosis-cli/{PROTOCOL_CLI_VERSION}",
            "X-Osmosis-CLI-Version": PROTOCOL_CLI_VERSION,
            "Authorization": f"Bearer {self.token}",
        }
        if self.workspace_name is not None:
            headers["X-Osmosis-Workspace"] = self.workspace_name
        elif self.git_identity is not None:
            headers["X-Osmosis-Git"] = self.git_identity
        return headers

    def context(self) -> dict[str, Any]:
        """The scope for a result envelope (no credential)."""
        if self.workspace_name is not None:
            return {"workspace": {"name": self.workspace_name}}
        return {"git": {"identity": self.git_identity, "remote_url": self.repo_url}}


def _env_token(environ: Mapping[str, str], platform_url: str) -> str | None:
    token = environ.get("OSMOSIS_TOKEN")
    if not token:
        return None
    bound = environ.get("OSMOSIS_TOKEN_PLATFORM_URL")
    if bound:
        if normalize_platform_url(bound) != platform_url:
            raise AuthError(
                f"OSMOSIS_TOKEN is bound to {normalize_platform_url(bound)}, but the active "
                f"platform is {platform_url}. Refusing to send the token to a different platform.",
                code="ENV_TOKEN_PLATFORM_MISMATCH",
            )
    elif platform_url != normalize_platform_url(DEFAULT_PLATFORM_URL):
        raise AuthError(
            "OSMOSIS_TOKEN must be bound to this non-production platform. "
            f"Set OSMOSIS_TOKEN_PLATFORM_URL={platform_url}.",
            code="ENV_TOKEN_PLATFORM_REQUIRED",
        )
    return token


def _entry(data: dict[str, Any], platform_url: str) -> dict[str, Any] | None:
    if data.get("version") != 2:
        return None
    platforms = data.get("platforms")
    if isinstance(platforms, dict):
        for key, entry in platforms.items():
            if not isinstance(entry, dict) or not isinstance(key, str):
                continue
            if normalize_platform_url(entry.get("platform_url") or key) == platform_url:
                return entry
        return None
    return data if platform_url == normalize_platform_url(DEFAULT_PLATFORM_URL) else None


def _keyring_token(entry: dict[str, Any], platform_url: str) -> str | None:
    try:
        import keyring  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    prefix = "platform:" + hashlib.sha256(platform_url.encode()).hexdigest()[:24]
    accounts = [entry.get("keyring_account"), prefix]
    if platform_url == normalize_platform_url(DEFAULT_PLATFORM_URL):
        accounts.append("default")
    for account in accounts:
        if isinstance(account, str) and account:
            try:
                token = keyring.get_password(_KEYRING_SERVICE, account)
            except Exception:  # any keyring backend failure means "not available here"
                return None
            if isinstance(token, str) and token:
                return token
    return None


def _file_token(home: Path, platform_url: str) -> str | None:
    path = home / ".config" / "osmosis" / "credentials.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        raise AuthError(
            f"Could not read the credentials at {path}; repair or move it, then log in again."
        ) from None
    entry = _entry(data, platform_url) if isinstance(data, dict) else None
    if entry is None:
        return None
    expires = entry.get("expires_at")
    try:
        if isinstance(expires, str) and datetime.fromisoformat(expires) <= datetime.now(UTC):
            raise AuthError(
                "Your session has expired. Please run 'osmosis auth login' to re-authenticate."
            )
    except (TypeError, ValueError):
        raise AuthError(f"The credentials at {path} are invalid; log in again.") from None
    if entry.get("token_store", "file") == "keyring":
        return _keyring_token(entry, platform_url)
    token = entry.get("access_token")
    return token if isinstance(token, str) and token else None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else None


def git_identity(cwd: Path) -> tuple[str | None, str | None]:
    """``(owner/repo, display URL)`` of the github.com ``origin`` of the git work tree at or
    above ``cwd``; ``(None, None)`` without one. The display URL carries no credentials."""
    top = _git(cwd, "rev-parse", "--show-toplevel")
    url = _git(Path(top), "remote", "get-url", "origin") if top else None
    if url is None or any(c.isspace() or ord(c) < 32 for c in url):
        return None, None
    scp = _SCP_LIKE.fullmatch(url)
    if scp is not None:
        url = f"ssh://{scp['user']}@{scp['host']}/{scp['path']}"
    try:
        parsed = urlsplit(url)
        host = (parsed.hostname or "").lower()
    except ValueError:
        return None, None
    path = parsed.path
    if host != "github.com" or "%2f" in path.lower() or "%5c" in path.lower():
        return None, None
    path = path.strip("/").removesuffix(".git")
    identity = path.lower()
    if not _GITHUB_IDENTITY.fullmatch(identity):
        return None, None
    netloc = parsed.netloc.rsplit("@", 1)[-1]
    if parsed.scheme == "ssh" and parsed.username == "git":
        netloc = f"git@{netloc}"
    return identity, urlunsplit((parsed.scheme, netloc, parsed.path, "", ""))


def resolve_identity(
    environ: Mapping[str, str], *, cwd: Path, home: Path, workspace_name: str | None
) -> PlatformIdentity:
    """Resolve the platform, the token and the scope; one-line errors that say what to do."""
    platform_url = normalize_platform_url(environ.get("OSMOSIS_PLATFORM_URL"))
    if not platform_url.startswith("https://") and not is_loopback_url(platform_url):
        raise CLIError(
            f"Refusing to send credentials over plain HTTP to {platform_url}; "
            "use an https:// OSMOSIS_PLATFORM_URL."
        )
    if workspace_name is not None and not _header_safe(workspace_name):
        raise CLIError(
            f"--workspace {workspace_name!r} is not a workspace name: it must be printable "
            "ASCII without line breaks, and not empty"
        )
    identity, repo_url = (None, None) if workspace_name else git_identity(cwd)
    if workspace_name is None and identity is None:
        raise CLIError(
            "Set `origin` to the Platform-connected GitHub repository, or pass "
            "--workspace NAME to choose the platform workspace."
        )
    token = _env_token(environ, platform_url) or _file_token(home, platform_url)
    if token is None:
        raise AuthError(f"Not logged in to {platform_url}. {LOGIN_HINT}")
    token = token.strip()  # a pasted token's line break or spaces around it
    if len(token) < MIN_TOKEN_LENGTH or not _header_safe(token) or " " in token:
        # Said without the token: it may still be one (a short one would also be "redacted"
        # in every message it happens to occur in).
        raise AuthError(
            f"The platform token for {platform_url} is malformed (it must be at least "
            f"{MIN_TOKEN_LENGTH} printable ASCII characters, without spaces). {LOGIN_HINT}",
            code="TOKEN_MALFORMED",
        )
    return PlatformIdentity(platform_url, token, identity, workspace_name, repo_url)


#: The shortest platform token taken (the redaction policy's shortest secret as well).
MIN_TOKEN_LENGTH = 8


def _header_safe(value: str) -> bool:
    """Printable ASCII (an HTTP header can carry it as is), not empty."""
    return bool(value) and value.isascii() and value.isprintable()
