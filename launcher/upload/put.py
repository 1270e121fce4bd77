"""Presigned PUTs of one file: a single PUT, or the parts of an S3 multipart upload (spec C.8).

The body is read from the open file with ``pread`` in :data:`PUT_CHUNK` pieces as httpx sends
it (a window of the file per part), so memory stays bounded whatever the file size, and a retry
simply starts the window again. The part size is the server's; there is no client constant.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import httpx
import trio

from rollout_server.net.hosts import is_loopback_host

__all__ = ["PUT_CHUNK", "PutError", "UploadInfo", "put_file"]

PUT_CHUNK = 256 * 1024
MAX_ATTEMPTS = 5
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 8.0
SIMPLE_TIMEOUT_S = 600.0
PART_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 30.0
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})

#: ``progress(delta)``: bytes sent (negative when a failed attempt's bytes are taken back).
Progress = Callable[[int], None]


class PutError(RuntimeError):
    """A presigned upload failed (the message is the user's)."""


@dataclass(frozen=True)
class UploadInfo:
    """The ``upload`` object of one instruction."""

    method: str
    presigned_url: str | None
    upload_headers: dict[str, str]
    part_size: int | None
    total_parts: int | None
    presigned_urls: list[Any]

    @classmethod
    def parse(cls, data: Any) -> UploadInfo:
        """Parse an instruction's ``upload`` object; ValueError when malformed."""
        if not isinstance(data, dict):
            raise ValueError("Eval import upload instruction is missing upload details")
        method = data.get("method", "simple")
        if method not in ("simple", "multipart"):
            raise ValueError(
                f"Unknown upload method {method!r}. Expected one of: multipart, simple"
            )
        headers = data.get("upload_headers") or {}
        urls = data.get("presigned_urls") or []
        if not isinstance(headers, dict) or not isinstance(urls, list):
            raise ValueError("Malformed upload instruction")
        return cls(
            method,
            data.get("presigned_url"),
            {str(k): str(v) for k, v in headers.items()},
            data.get("part_size"),
            data.get("total_parts"),
            urls,
        )


def _loopback(host: str) -> bool:
    try:
        return is_loopback_host(host.lower())
    except ValueError:
        return False


def _require_secure(url: object, context: str, loopback_http: bool) -> str:
    """``url`` if it is ``https://`` (or ``http://`` to loopback when ``loopback_http``, the
    platform itself being on loopback); any other scheme or a malformed URL is refused."""
    if not isinstance(url, str) or not url:
        raise PutError(f"{context} is invalid. Refusing to upload.")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise PutError(f"{context} is not a valid URL. Refusing to upload.") from None
    if not parsed.host or not (
        parsed.scheme == "https"
        or (parsed.scheme == "http" and loopback_http and _loopback(parsed.host))
    ):
        raise PutError(f"{context} must use HTTPS. Refusing to upload over an insecure connection.")
    return url


async def _window(
    handle: BinaryIO, offset: int, length: int, sent: list[int], progress: Progress
) -> AsyncIterator[bytes]:
    fd = handle.fileno()
    position, end = offset, offset + length
    while position < end:
        chunk = await trio.to_thread.run_sync(
            os.pread, fd, min(PUT_CHUNK, end - position), position
        )
        if not chunk:
            raise PutError("the file ended before its planned size; retry")
        position += len(chunk)
        sent[0] += len(chunk)
        progress(len(chunk))
        yield chunk


async def _put(
    client: httpx.AsyncClient,
    url: str,
    handle: BinaryIO,
    offset: int,
    length: int,
    headers: dict[str, str],
    limit_s: float,
    progress: Progress,
) -> httpx.Response:
    """PUT the window, retrying 429/5xx and transport errors with backoff (1, 2, 4, 8 s); a
    request that cannot be sent as instructed (bad headers) fails at once."""
    last = "unknown upload error"
    for attempt in range(MAX_ATTEMPTS):
        if attempt:
            await trio.sleep(min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_CAP_S))
        sent = [0]
        try:
            response = await client.put(
                url,
                content=_window(handle, offset, length, sent, progress),
                headers={**headers, "Content-Length": str(length)},
                timeout=httpx.Timeout(limit_s, connect=CONNECT_TIMEOUT_S),
            )
        except httpx.LocalProtocolError:
            # The request cannot be sent as instructed (the upload headers): no retry can help.
            progress(-sent[0])
            raise PutError(
                "Upload failed: the upload instruction's headers cannot be sent "
                "(LocalProtocolError)"
            ) from None
        except httpx.TransportError as exc:
            progress(-sent[0])
            last = type(exc).__name__
            continue
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            progress(-sent[0])
            raise PutError(f"Upload failed: {type(exc).__name__}") from None
        if 200 <= response.status_code < 300:
            return response
        progress(-sent[0])
        if response.status_code not in _RETRY_STATUS:
            raise PutError(f"Upload failed: HTTP {response.status_code}")
        last = f"HTTP {response.status_code}"
    raise PutError(f"Upload failed after {MAX_ATTEMPTS} attempts (last failure: {last})")


def _parts(
    info: UploadInfo, size: int, loopback_http: bool = False
) -> tuple[int, int, dict[int, tuple[str, int | None]]]:
    part_size, total = info.part_size, info.total_parts
    if not isinstance(part_size, int) or not isinstance(total, int) or part_size <= 0 or total <= 0:
        raise PutError("Multipart upload instructions lack a valid part_size and total_parts")
    if size < part_size * (total - 1) + 1:
        raise PutError(f"File of {size} bytes is too small for {total} parts of {part_size} bytes")
    if size > part_size * total:
        raise PutError(
            f"File of {size} bytes exceeds {total} parts of {part_size} bytes; "
            "it would be silently truncated"
        )
    urls: dict[int, tuple[str, int | None]] = {}
    for entry in info.presigned_urls:
        number = entry.get("part_number") if isinstance(entry, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
            raise PutError("Multipart upload instructions have an invalid part_number")
        if number in urls:
            raise PutError(f"Multipart upload instructions repeat part {number}")
        signed = entry.get("size")
        url = _require_secure(entry.get("presigned_url"), f"Part {number} URL", loopback_http)
        urls[number] = (url, signed)
    missing = [n for n in range(1, total + 1) if n not in urls]
    if missing:
        raise PutError(
            f"Server returned presigned URLs for {len(urls)} parts, but {total} expected. "
            f"Missing: {missing[:10]}"
        )
    return part_size, total, urls


async def put_file(
    client: httpx.AsyncClient,
    handle: BinaryIO,
    size: int,
    info: UploadInfo,
    progress: Progress,
    *,
    loopback_http: bool = False,
) -> list[dict[str, Any]] | None:
    """Upload the open file as ``info`` says; the ``[{part_number, etag}]`` of a multipart
    upload (for the complete request), None for a single PUT. URLs must be ``https://``;
    ``loopback_http`` (a platform on loopback) also allows ``http://`` to loopback."""
    if info.method != "multipart":
        url = _require_secure(info.presigned_url, "Upload URL", loopback_http)
        await _put(client, url, handle, 0, size, info.upload_headers, SIMPLE_TIMEOUT_S, progress)
        return None
    part_size, total, urls = _parts(info, size, loopback_http)
    parts: list[dict[str, Any]] = []
    for number in range(1, total + 1):
        offset = (number - 1) * part_size
        length = min(part_size, size - offset)
        url, signed = urls[number]
        if signed is not None and signed != length:
            raise PutError(
                f"Part {number}: server signed {signed} bytes, but the local part is {length} bytes"
            )
        response = await _put(client, url, handle, offset, length, {}, PART_TIMEOUT_S, progress)
        etag = response.headers.get("ETag", "").strip('"')
        if not etag:
            raise PutError(f"Part {number}: S3 did not return an ETag header")
        parts.append({"part_number": number, "etag": etag})
    return parts
