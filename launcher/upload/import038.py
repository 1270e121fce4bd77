"""osmosis-ai 0.3.8's local-eval import protocol (spec C.5-C.8), as a :class:`Transport`.

Start (the server finds or creates the import from ``local_run_id`` + ``manifest_digest``),
ask in batches of 100 which files it still needs, PUT each of those to its presigned URL and
report it complete, then finalize. Every answer is checked against the plan; a rerun after an
interruption at any point reaches the same import and sends only what was not acknowledged.
Request bodies are serialized as the reference serializes them (``json.dumps`` defaults).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from launcher.upload.files import PlanFile
from launcher.upload.identity import PlatformIdentity, is_loopback_url
from launcher.upload.plan import UploadPlan
from launcher.upload.progress import UploadProgress
from launcher.upload.put import UploadInfo, put_file
from launcher.upload.transport import PlatformError, Published, printable

__all__ = ["BATCH", "Import038", "ImportState"]

BATCH = 100
_SHA256 = re.compile(r"[0-9a-f]{64}")
_EXPIRED = "Your session has expired. Please run 'osmosis auth login' to re-authenticate."
_ENV_INVALID = (
    "The OSMOSIS_TOKEN environment variable is invalid or expired. Run 'unset OSMOSIS_TOKEN' "
    "to use saved credentials or interactive login, or set OSMOSIS_TOKEN to a valid token."
)


def _string(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"Eval import {key} must be a non-empty string")
    return value


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"Eval import {key} must be a non-negative integer")
    return value


def _entry(data: Any) -> tuple[str, int, str]:
    if not isinstance(data, dict):
        raise ValueError("Each eval import file must be an object")
    sha = data.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ValueError("Eval import sha256 must be 64 lowercase hex characters")
    return _string(data, "path"), _count(data, "size"), sha


@dataclass(frozen=True)
class ImportState:
    """An ``EvalRunImportResult``: the server's view of one import."""

    session_id: str
    status: str
    expected_files: int
    uploaded_files: int
    files: dict[str, tuple[int, str, str]]  # path -> (size, sha256, state)
    eval_run_id: str | None
    eval_run_name: str | None
    platform_url: str | None

    @classmethod
    def parse(cls, data: dict[str, Any]) -> ImportState:
        """Parse and check the shape (C.6); ValueError when it does not fit."""
        status = data.get("status")
        if status not in ("uploading", "finalized"):
            raise ValueError(f"Unknown eval import status {status!r}")
        raw = data.get("files")
        if not isinstance(raw, list):
            raise ValueError("Eval import files must be a list")
        files: dict[str, tuple[int, str, str]] = {}
        for item in raw:
            path, size, sha = _entry(item)
            state = item.get("state")
            if state not in ("pending", "uploaded"):
                raise ValueError(f"Unknown eval import file state {state!r}")
            if path in files:
                raise ValueError(f"Duplicate eval import file {path!r}")
            files[path] = (size, sha, state)
        expected, uploaded = _count(data, "expected_files"), _count(data, "uploaded_files")
        if uploaded > expected:
            raise ValueError("Eval import uploaded_files exceeds expected_files")
        optional = {
            k: v if isinstance(v := data.get(k), str) and v else None
            for k in ("eval_run_id", "eval_run_name", "platform_url")
        }
        return cls(
            _string(data, "session_id"),
            status,
            expected,
            uploaded,
            files,
            optional["eval_run_id"],
            optional["eval_run_name"],
            optional["platform_url"],
        )

    def check(self, local: dict[str, PlanFile]) -> None:
        """The server's file set, sizes, hashes and counts must be the plan's (C.6)."""
        if set(self.files) != set(local):
            missing = sorted(set(local) - set(self.files))
            unknown = sorted(set(self.files) - set(local))
            detail = [f"missing {missing[:5]}"] if missing else []
            detail += [f"unknown {unknown[:5]}"] if unknown else []
            raise RuntimeError(
                "Server returned a different eval import file set"
                + (f": {'; '.join(detail)}" if detail else "")
            )
        for path, (size, sha, _) in self.files.items():
            if (size, sha) != (local[path].size, local[path].sha256):
                raise RuntimeError(f"Server returned mismatched size or sha256 for {path!r}")
        uploaded = sum(state == "uploaded" for _, _, state in self.files.values())
        if self.expected_files != len(local) or self.uploaded_files != uploaded:
            raise RuntimeError("Server returned inconsistent eval import file counts")

    def check_finalized(self) -> None:
        """A finalized import names its platform run and holds every file (C.7)."""
        if self.status != "finalized":
            raise RuntimeError(f"Server did not finalize the eval import (status {self.status!r})")
        if not (self.eval_run_id and self.eval_run_name and self.platform_url):
            raise RuntimeError("Finalized eval import response is missing run details")
        if (
            self.uploaded_files != self.expected_files
            or len(self.files) != self.expected_files
            or any(state != "uploaded" for _, _, state in self.files.values())
        ):
            raise RuntimeError("Finalized eval import response has incomplete files")


def _error_message(body: dict[str, Any]) -> str | None:
    """The platform's message and its issues, one line each, every piece :func:`printable`."""
    message = next(
        (
            printable(v.strip())
            for v in (body.get("message"), body.get("error"))
            if isinstance(v, str) and v.strip()
        ),
        None,
    )
    if message is None:
        return None
    issues = body.get("issues")
    if isinstance(issues, list):
        lines = []
        for issue in issues:
            if isinstance(issue, str):
                lines.append(printable(issue))
            elif isinstance(issue, dict) and isinstance(issue.get("message"), str):
                where = issue.get("path")
                if isinstance(where, list):
                    where = ".".join(str(p) for p in where)
                text = f"{where}: {issue['message']}" if where else issue["message"]
                lines.append(printable(text))
        if lines:
            message += "\n" + "\n".join(f"  - {line}" for line in lines)
    return message


def _platform_error(response: httpx.Response, env_token: bool) -> PlatformError:
    text = response.text.strip()
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        parsed = {}
    body = parsed if isinstance(parsed, dict) else {}
    code = body.get("code") if isinstance(body.get("code"), str) else None
    status = response.status_code
    if status == 401:
        return PlatformError(
            _ENV_INVALID if env_token else _EXPIRED, status=401, code=code or "AUTH_EXPIRED"
        )
    message = _error_message(body)
    if message is None:
        excerpt = printable(text[:200])
        detail = (
            f" Response: {excerpt}{'...(truncated)' if len(text) > 200 else ''}" if text else ""
        )
        message = f"API error: HTTP {status}.{detail}"
    return PlatformError(message, status=status, code=code or "PLATFORM", details=body or None)


class Import038:
    """The 0.3.8 import protocol over one httpx client (API calls and presigned PUTs; only the
    API calls carry the platform headers)."""

    def __init__(
        self, identity: PlatformIdentity, client: httpx.AsyncClient, *, env_token: bool = False
    ) -> None:
        self._identity = identity
        self._client = client
        self._env_token = env_token

    async def _call(self, path: str, body: dict[str, Any], limit_s: float) -> dict[str, Any]:
        url = f"{self._identity.platform_url}{path}"
        try:
            response = await self._client.post(
                url,
                content=json.dumps(body).encode(),
                headers=self._identity.headers(),
                timeout=httpx.Timeout(limit_s),
            )
        except httpx.TimeoutException:
            raise PlatformError(
                "Connection to the platform timed out. Check your connection and try again."
            ) from None
        except httpx.ConnectError as exc:
            raise PlatformError(f"Could not connect to platform: {exc}") from None
        except httpx.TransportError as exc:  # connected, then the connection failed
            why = str(exc) or type(exc).__name__
            raise PlatformError(
                f"The connection to the platform broke off ({why}). Check your connection and "
                "try again."
            ) from None
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            # A body that cannot be decoded, a URL that cannot be requested: the platform's
            # request failed, whatever httpx calls it.
            raise PlatformError(f"Platform request failed ({type(exc).__name__})") from None
        if not 200 <= response.status_code < 300:
            raise _platform_error(response, self._env_token)
        if response.status_code == 204 or not response.content:
            return {}
        try:
            data = response.json()
        except ValueError:
            raise PlatformError("Invalid JSON response from platform") from None
        if not isinstance(data, dict):
            raise PlatformError("Invalid JSON response from platform")
        return data

    async def _send(
        self, session: str, local: PlanFile, upload: Any, progress: UploadProgress
    ) -> None:
        info = UploadInfo.parse(upload)
        progress.file(local.path)
        with local.open_verified() as handle:
            parts = await put_file(
                self._client,
                handle,
                local.size,
                info,
                progress.advance,
                loopback_http=is_loopback_url(self._identity.platform_url),
            )
        body: dict[str, Any] = {"path": local.path}
        if parts is not None:
            numbers = [p["part_number"] for p in parts]
            if len(numbers) != len(set(numbers)):
                raise ValueError("Duplicate multipart part numbers")
            body["parts"] = parts
        await self._call(
            f"/api/cli/eval-runs/imports/{session}/uploads/complete",
            body,
            120.0 if parts is not None else 30.0,
        )

    async def publish(
        self, plan: UploadPlan, *, replace: bool, progress: UploadProgress
    ) -> Published:
        """Start or resume, upload what the server lacks one file at a time, finalize."""
        local = {f.path: f for f in plan.files}
        start = ImportState.parse(
            await self._call("/api/cli/eval-runs/imports", plan.start_body(replace=replace), 30.0)
        )
        start.check(local)
        session = quote(start.session_id, safe="")
        lacking = [p for p, (_, _, state) in start.files.items() if state != "uploaded"]
        progress.begin(sum(local[p].size for p in lacking) if start.status != "finalized" else 0)
        try:
            if start.status != "finalized":
                for offset in range(0, len(plan.files), BATCH):
                    batch = plan.files[offset : offset + BATCH]
                    answer = await self._call(
                        f"/api/cli/eval-runs/imports/{session}/uploads",
                        {"paths": [f.path for f in batch]},
                        30.0,
                    )
                    for path, upload in self._instructions(answer, batch):
                        await self._send(session, local[path], upload, progress)
        finally:
            progress.close()
        final = ImportState.parse(
            await self._call(f"/api/cli/eval-runs/imports/{session}/finalize", {}, 300.0)
        )
        final.check(local)
        final.check_finalized()
        assert final.eval_run_id and final.eval_run_name and final.platform_url
        return Published(
            final.session_id,
            final.status,
            final.expected_files,
            final.uploaded_files,
            final.eval_run_id,
            final.eval_run_name,
            final.platform_url,
            progress.files,
            progress.sent,
        )

    @staticmethod
    def _instructions(answer: dict[str, Any], batch: tuple[PlanFile, ...]) -> list[tuple[str, Any]]:
        """The batch's instructions, checked (C.7): known paths, the plan's sizes and hashes."""
        raw = answer.get("files", [])
        if not isinstance(raw, list):
            raise ValueError("Eval import upload instructions must be a list")
        requested = {f.path: f for f in batch}
        found: list[tuple[str, Any]] = []
        seen: set[str] = set()
        for item in raw:
            if not isinstance(item, dict):
                raise ValueError("Each eval import upload instruction must be an object")
            path, size, sha = _entry(item)
            if not isinstance(item.get("upload"), dict):
                raise ValueError("Eval import upload instruction is missing upload details")
            if path in seen:
                raise ValueError(f"Duplicate eval import upload instruction {path!r}")
            seen.add(path)
            if path not in requested:
                raise RuntimeError(f"Server returned upload instructions for unknown path {path!r}")
            if (size, sha) != (requested[path].size, requested[path].sha256):
                raise RuntimeError(f"Server returned mismatched size or sha256 for {path!r}")
            found.append((path, item["upload"]))
        return found
