"""A recording stand-in of the platform's local-eval import API (spec C.5-C.8) and of the
object store's presigned PUT targets, on loopback, for the upload tests.

It is server-authoritative the way the platform is described: an import is found again by
``local_run_id`` (+ ``manifest_digest``), it hands out upload instructions only for files it
does not hold yet, it marks a file uploaded only when ``complete`` names bytes that hash to the
declared sha256, and finalize needs every file. A finalized import answers a start with the
same files as finalized again, and one with other files with a 409 unless ``reimport``.

Faults are injected per route (``start``, ``uploads``, ``complete``, ``finalize``, ``put``):
a 500 before the request is processed, or (``complete``) after it was, or a 422 with
validation ``issues`` (``invalid``), or a reset with no answer (``reset``). ``reset_put`` resets
the connection in the middle of a PUT body; ``on_part`` is called when the PUT of a given part
arrives (before its body is read), for a test that kills the client between two parts.
``stall_puts`` holds every PUT unanswered (``put_stalled`` is set when the first arrives),
for a test that interrupts the client in the middle of an upload.

Every listener checks its route and the bearer (or the presigned signature) before it reads a
body. HTTP is spoken with h11 on trio sockets, so a reset is a real RST.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import h11
import trio

__all__ = ["Recorded", "StandIn"]

_API = "/api/cli/eval-runs/imports"


@dataclass
class Recorded:
    """One request as the stand-in saw it (PUT bodies by size and sha256)."""

    method: str
    route: str  # the path with the session id replaced by {session}
    headers: dict[str, str]
    body: Any  # parsed JSON for API calls; {"size", "sha256"} for PUTs
    query: dict[str, str]
    status: int = 0


@dataclass
class _Import:
    session_id: str
    local_run_id: str
    manifest_digest: str
    name: str
    files: dict[str, tuple[int, str]]
    state: dict[str, str]
    eval_run_id: str
    status: str = "uploading"


@dataclass
class StandIn:
    """The stand-in; ``await nursery.start(stand_in.serve)`` binds it and returns its URL."""

    token: str
    part_size: int = 128 * 1024
    multipart_over: int = 200 * 1024
    requests: list[Recorded] = field(default_factory=list)
    faults: dict[str, list[str]] = field(default_factory=dict)  # route -> ["before"|"after"...]
    reset_put: set[str] = field(default_factory=set)  # upload paths to reset once mid-PUT
    on_part: Callable[[str, int], None] | None = None
    stall_puts: bool = False
    put_stalled: trio.Event = field(default_factory=trio.Event)
    conflict_message: str = "This local evaluation was already imported with different results."
    imports: dict[str, _Import] = field(default_factory=dict)
    objects: dict[tuple[str, str, int], bytes] = field(default_factory=dict)
    stored: dict[str, bytes] = field(default_factory=dict)  # path -> bytes acknowledged
    acknowledged: Counter[str] = field(default_factory=Counter)
    url: str = ""
    _sessions: int = 0

    # -- serving -----------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 port 0 until cancelled; reports the base URL."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.url)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = await self._next(conn, stream)
                if not isinstance(event, h11.Request):
                    return
                keep = await self._request(conn, stream, event)
                if not keep or conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return
        finally:
            await stream.aclose()

    @staticmethod
    async def _next(conn: h11.Connection, stream: trio.SocketStream) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await stream.receive_some(65536))

    async def _send(
        self, conn: h11.Connection, stream: trio.SocketStream, status: int, body: Any, **extra: str
    ) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        headers = [("Content-Length", str(len(data)))]
        if body is not None:
            headers.append(("Content-Type", "application/json"))
        headers += [(k, v) for k, v in extra.items()]
        # Recorded before the answer leaves: the client's next request (perhaps on another
        # connection) may be recorded before this task runs again.
        self.requests[-1].status = status
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
        await stream.send_all(conn.send(h11.Data(data=data)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    def _fault(self, route: str) -> str | None:
        pending = self.faults.get(route)
        return pending.pop(0) if pending else None

    async def _request(
        self, conn: h11.Connection, stream: trio.SocketStream, req: h11.Request
    ) -> bool:
        target = urlsplit(req.target.decode())
        path = unquote(target.path)
        query = {k: v[0] for k, v in parse_qs(target.query).items()}
        headers = {k.decode().lower(): v.decode() for k, v in req.headers}
        method = req.method.decode()
        if method == "PUT" and target.path.startswith("/s3/"):
            return await self._put(conn, stream, target.path, query, headers)
        route, session = self._route(target.path)
        self.requests.append(Recorded(method, route or path, headers, None, query))
        if route is None or method != "POST":
            await self._send(conn, stream, 404, {"error": "not found"})
            return False
        if headers.get("authorization") != f"Bearer {self.token}":
            await self._send(conn, stream, 401, {"error": "unauthorized", "code": "TOKEN_INVALID"})
            return False
        body = bytearray()
        while isinstance(event := await self._next(conn, stream), h11.Data):
            body += event.data
        parsed = json.loads(body) if body else None
        self.requests[-1].body = parsed
        kind = route.rsplit("/", 1)[-1] if session else "start"
        fault = self._fault(kind)
        if fault == "reset":  # the connection reset with the request read, no answer sent
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if fault == "before":
            await self._send(conn, stream, 500, {"error": "injected fault"})
            return True
        if fault == "invalid":
            invalid = {
                "error": "Eval import failed validation",
                "code": "VALIDATION",
                "issues": [
                    {"path": ["files", "index.jsonl"], "message": "row 3 missing"},
                    "second",
                ],
            }
            await self._send(conn, stream, 422, invalid)
            return True
        status, answer = self._api(kind, session, parsed)
        if fault == "after":
            status, answer = 500, {"error": "injected fault after processing"}
        await self._send(conn, stream, status, answer)
        return True

    @staticmethod
    def _route(raw_path: str) -> tuple[str | None, str | None]:
        if raw_path == _API:
            return _API, None
        if not raw_path.startswith(_API + "/"):
            return None, None
        session, _, rest = raw_path[len(_API) + 1 :].partition("/")
        if rest not in ("uploads", "uploads/complete", "finalize"):
            return None, None
        return f"{_API}/{{session}}/{rest}", unquote(session)

    # -- the import API ----------------------------------------------------------------

    def _state(self, imp: _Import) -> dict[str, Any]:
        files = [
            {"path": p, "size": s, "sha256": h, "state": imp.state[p]}
            for p, (s, h) in sorted(imp.files.items())
        ]
        body: dict[str, Any] = {
            "session_id": imp.session_id,
            "status": imp.status,
            "expected_files": len(files),
            "uploaded_files": sum(f["state"] == "uploaded" for f in files),
            "files": files,
            "expires_at": "2026-12-31T00:00:00Z",
        }
        if imp.status == "finalized":
            body["eval_run_id"] = imp.eval_run_id
            body["eval_run_name"] = imp.name
            body["platform_url"] = f"https://platform.example/evals/{imp.eval_run_id}"
        return body

    def _new_session(self) -> str:
        self._sessions += 1
        return f"sess/{self._sessions}"  # a slash: the client must percent-encode it

    def _api(self, kind: str, session: str | None, body: Any) -> tuple[int, Any]:
        if kind == "start":
            return self._start(body)
        imp = next((i for i in self.imports.values() if i.session_id == session), None)
        if imp is None:
            return 404, {"error": "unknown import session"}
        if kind == "uploads":
            return 200, {
                "files": [
                    self._instruction(imp, p)
                    for p in body["paths"]
                    if imp.state.get(p) == "pending"
                ]
            }
        if kind == "complete":
            return self._complete(imp, body)
        if any(s != "uploaded" for s in imp.state.values()):
            missing = sorted(p for p, s in imp.state.items() if s != "uploaded")
            return 400, {
                "error": "Eval import is missing files",
                "code": "EVAL_IMPORT_INCOMPLETE",
                "issues": missing[:3],
            }
        imp.status = "finalized"
        return 200, self._state(imp)

    def _start(self, body: dict[str, Any]) -> tuple[int, Any]:
        files = {f["path"]: (f["size"], f["sha256"]) for f in body["files"]}
        local_run_id, digest = body["local_run_id"], body["manifest_digest"]
        imp = self.imports.get(local_run_id)
        if imp is not None and imp.manifest_digest != digest:
            return 409, {
                "error": "The manifest digest differs from the imported run.",
                "code": "EVAL_IMPORT_MANIFEST_MISMATCH",
            }
        if imp is None or (imp.status == "finalized" and imp.files != files and body["reimport"]):
            run_id = imp.eval_run_id if imp is not None else f"er_{len(self.imports) + 1}"
            imp = _Import(
                self._new_session(),
                local_run_id,
                digest,
                body["run"]["name"],
                files,
                dict.fromkeys(files, "pending"),
                run_id,
            )
            self.imports[local_run_id] = imp
        elif imp.status == "finalized" and imp.files != files:
            return 409, {"error": self.conflict_message, "code": "EVAL_IMPORT_CONFLICT"}
        elif imp.files != files:
            imp.state = {
                p: imp.state.get(p, "pending") if imp.files.get(p) == files[p] else "pending"
                for p in files
            }
            imp.files = files
        return 200, self._state(imp)

    def _instruction(self, imp: _Import, path: str) -> dict[str, Any]:
        size, sha = imp.files[path]
        key = f"{self.url}/s3/{quote(imp.session_id, safe='')}/{quote(path, safe='/')}"
        if size <= self.multipart_over:
            upload: dict[str, Any] = {
                "method": "simple",
                "presigned_url": f"{key}?sig=ok",
                "expires_in": 900,
                "upload_headers": {"Content-Type": "application/octet-stream"},
            }
        else:
            total = -(-size // self.part_size)
            upload = {
                "method": "multipart",
                "part_size": self.part_size,
                "total_parts": total,
                "presigned_urls": [
                    {
                        "part_number": n,
                        "presigned_url": f"{key}?partNumber={n}&sig=ok",
                        "size": min(self.part_size, size - (n - 1) * self.part_size),
                    }
                    for n in range(1, total + 1)
                ],
            }
        return {"path": path, "size": size, "sha256": sha, "upload": upload}

    def _complete(self, imp: _Import, body: dict[str, Any]) -> tuple[int, Any]:
        path = body["path"]
        if path not in imp.files:
            return 400, {"error": f"unknown path {path}"}
        if imp.state[path] == "uploaded":
            return 200, {}
        if "parts" in body:
            pieces = []
            for part in body["parts"]:
                data = self.objects.get((imp.session_id, path, part["part_number"]))
                if data is None or part["etag"] != _etag(data):
                    return 400, {"error": f"part {part['part_number']} of {path} is missing"}
                pieces.append(data)
            data = b"".join(pieces)
        else:
            data = self.objects.get((imp.session_id, path, 0), b"")
        if hashlib.sha256(data).hexdigest() != imp.files[path][1]:
            return 400, {
                "error": f"{path} does not match its sha256",
                "issues": [{"path": ["files", path], "message": "sha256 mismatch"}],
            }
        imp.state[path] = "uploaded"
        self.stored[path] = data
        self.acknowledged[path] += 1
        return 200, {}

    # -- presigned PUT targets ---------------------------------------------------------

    async def _put(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        raw: str,
        query: dict[str, str],
        headers: dict[str, str],
    ) -> bool:
        session, _, path = raw[len("/s3/") :].partition("/")
        session, path = unquote(session), unquote(path)
        part = int(query.get("partNumber", "0"))
        record = Recorded(
            "PUT", "/s3/{session}/" + path, headers, None, {k: v for k, v in query.items()}
        )
        self.requests.append(record)
        if query.get("sig") != "ok" or "authorization" in headers:
            await self._send(conn, stream, 403, {"error": "bad signature"})
            return False
        if self.on_part is not None and part:
            self.on_part(path, part)
        if self.stall_puts:
            self.put_stalled.set()
            await trio.sleep_forever()
        fault = self._fault("put")
        data = bytearray()
        while isinstance(event := await self._next(conn, stream), h11.Data):
            data += event.data
            if path in self.reset_put and len(data) >= 1024:
                self.reset_put.discard(path)
                record.body = {"reset_after": len(data)}
                stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                return False
        record.body = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if fault is not None:
            await self._send(conn, stream, 500, None)
            return True
        self.objects[(session, path, part)] = bytes(data)
        await self._send(conn, stream, 200, None, ETag=f'"{_etag(bytes(data))}"')
        return True


def _etag(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()
