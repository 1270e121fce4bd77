"""Presigned PUTs stream the file in bounded pieces (never the whole file or part in memory),
send exactly each part's window, and retry only what the spec retries: a URL that is not
https (or loopback http for a loopback platform), a request that cannot be sent as instructed
and an answer that cannot be read fail at once, as the upload's own one-line errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
import trio

from launcher.upload import put
from launcher.upload.put import PUT_CHUNK, PutError, UploadInfo, put_file


def _multipart(size: int, part: int) -> UploadInfo:
    total = -(-size // part)
    urls = [
        {"part_number": n, "presigned_url": f"https://s3.example/o?part={n}"}
        for n in range(1, total + 1)
    ]
    return UploadInfo.parse(
        {"method": "multipart", "part_size": part, "total_parts": total, "presigned_urls": urls}
    )


class _Streaming(httpx.AsyncBaseTransport):
    """Calls ``handler`` with the request's body still a stream (httpx's MockTransport reads
    it whole first, which would hide how the client sends it)."""

    def __init__(self, handler: object) -> None:
        self.handler = handler

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.handler(request)  # type: ignore[operator,no-any-return]


async def test_parts_are_streamed_in_bounded_pieces(tmp_path: Path) -> None:
    data = (bytes(range(256)) * 4096) * 3 + b"tail"  # 3 MiB + 4 bytes
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    received: dict[str, bytes] = {}
    largest = [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        assert "authorization" not in request.headers
        body = bytearray()
        async for piece in request.stream:  # type: ignore[union-attr]
            largest[0] = max(largest[0], len(piece))
            body += piece
        assert int(request.headers["content-length"]) == len(body)
        received[request.url.params["part"]] = bytes(body)
        return httpx.Response(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})

    sent: list[int] = []
    with trio.fail_after(30):
        async with httpx.AsyncClient(transport=_Streaming(handler)) as client:
            with source.open("rb") as handle:
                parts = await put_file(
                    client, handle, len(data), _multipart(len(data), 1 << 20), sent.append
                )
    assert [p["part_number"] for p in parts or []] == [1, 2, 3, 4]
    assert b"".join(received[str(n)] for n in (1, 2, 3, 4)) == data
    assert 0 < largest[0] <= PUT_CHUNK
    assert sum(sent) == len(data)


@pytest.mark.parametrize(
    ("status", "attempts", "message"), [(503, 5, "after 5 attempts"), (403, 1, "HTTP 403")]
)
async def test_retry_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int, attempts: int, message: str
) -> None:
    # The file is read on worker threads, which an autojump clock would jump over: the real
    # backoff (1, 2, 4, 8 s) is shortened instead.
    monkeypatch.setattr(put, "BACKOFF_BASE_S", 0.001)
    source = tmp_path / "f.txt"
    source.write_bytes(b"x" * 1000)
    calls = [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        calls[0] += 1
        return httpx.Response(status)

    sent: list[int] = []
    info = UploadInfo.parse({"presigned_url": "http://127.0.0.1:1/o", "upload_headers": {}})
    with trio.fail_after(60):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with source.open("rb") as handle, pytest.raises(PutError, match=message):
                await put_file(client, handle, 1000, info, sent.append, loopback_http=True)
    assert calls[0] == attempts
    assert put.MAX_ATTEMPTS == 5


@pytest.mark.parametrize(
    ("url", "loopback_http", "message"),
    [
        ("file://localhost/etc/passwd", True, "Upload URL must use HTTPS"),
        ("ftp://127.0.0.1/o", True, "Upload URL must use HTTPS"),
        ("http://127.0.0.1:1/o", False, "Upload URL must use HTTPS"),
        ("http://s3.example/o", True, "Upload URL must use HTTPS"),
        ("https://[::1/x", True, "Upload URL is not a valid URL"),
    ],
)
async def test_urls_other_than_https_are_refused_at_once(
    tmp_path: Path, url: str, loopback_http: bool, message: str
) -> None:
    source = tmp_path / "f.txt"
    source.write_bytes(b"x" * 10)
    calls = [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        calls[0] += 1
        return httpx.Response(200)

    info = UploadInfo.parse({"presigned_url": url})
    with trio.fail_after(10):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with source.open("rb") as handle, pytest.raises(PutError, match=message):
                await put_file(client, handle, 10, info, [].append, loopback_http=loopback_http)
    assert calls[0] == 0


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (httpx.LocalProtocolError("Illegal header value"), "headers cannot be sent"),
        (httpx.DecodingError("bad gzip"), r"Upload failed: DecodingError$"),
    ],
)
async def test_what_a_retry_cannot_fix_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception, message: str
) -> None:
    monkeypatch.setattr(put, "BACKOFF_BASE_S", 0.001)  # were it retried, it would fail fast
    source = tmp_path / "f.txt"
    source.write_bytes(b"x" * 10)
    calls = [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        calls[0] += 1
        raise raised

    sent: list[int] = []
    info = UploadInfo.parse({"presigned_url": "https://s3.example/o"})
    with trio.fail_after(10):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with source.open("rb") as handle, pytest.raises(PutError, match=message):
                await put_file(client, handle, 10, info, sent.append)
    assert calls[0] == 1 and sum(sent) == 0
