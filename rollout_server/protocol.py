"""Wire types and constants of the long-poll rollout protocol (protocol 0.4).

This module is the light, framework-free half of :mod:`rollout_server`: the launcher imports it
to speak the protocol, so it depends on msgspec only (no HTTP server, no trio).

Request bodies are validated by :func:`parse_rollout_init_request` and
:func:`parse_cancel_request`; they raise :class:`RequestValidationError`, whose ``errors`` list
has the same shape as the reference server's 422 bodies (``type``, ``loc``, ``msg``, ``input``).
Response bodies are decoded with :func:`decode_init_response`, :func:`decode_result_response`
and :func:`decode_cancel_response`, which raise :class:`msgspec.ValidationError` (or
:class:`msgspec.DecodeError`) on anything the protocol does not allow. ``/health`` is the
exception: its body is backend-defined, so :class:`HealthReport` reads it leniently (a field of
the wrong type reads as absent) and is the one place any package interprets it.

Why one module of this size: it is the whole wire contract (types, the 422-shaped validator
that stands in for pydantic, the ``/health`` reader, header and environment names). Anyone who
needs to know what crosses the wire reads one file, and it stays importable on its own.
"""

from __future__ import annotations

import enum
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

__all__ = [
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "ENV_API_KEY",
    "ENV_ARTIFACT_ROOT",
    "ENV_CHAT_COMPLETIONS_URL",
    "ENV_INSTANCE_ID",
    "ENV_PORT",
    "ENV_ROLLOUT_ID",
    "ENV_SERVER_TOKEN",
    "ENV_SUPERVISOR_PID",
    "INSTANCE_ID_HEADER",
    "LEASE_HEADER",
    "PROTOCOL_VERSION",
    "RAW_ARGUMENTS",
    "SDK_VERSION_HEADER",
    "TERMINAL_STATUSES",
    "CancelDisposition",
    "CancelRolloutsRequest",
    "CancelRolloutsResponse",
    "ChatEndpoint",
    "HealthReport",
    "RequestValidationError",
    "RolloutErrorCategory",
    "RolloutInitRequest",
    "RolloutInitResponse",
    "RolloutResultResponse",
    "RolloutSample",
    "RolloutStatus",
    "decode_cancel_response",
    "decode_init_response",
    "decode_result_response",
    "is_single_path_segment",
    "parse_cancel_request",
    "parse_rollout_init_request",
    "sdk_version",
]

PROTOCOL_VERSION: Final = "0.4"
"""The version of the long-poll rollout protocol this package speaks."""

LEASE_HEADER: Final = "X-Osmosis-Rollout-Lease"
"""Header that carries the polling lease token on ``GET /rollout/{id}/result``."""
INSTANCE_ID_HEADER: Final = "x-osmosis-rollout-instance-id"
"""Header on ``/health`` responses carrying the supervisor-injected instance id."""
SDK_VERSION_HEADER: Final = "x-osmosis-rollout-sdk-version"
"""Header on ``/health`` responses carrying the SDK version."""

ENV_PORT: Final = "_OSMOSIS_ROLLOUT_PORT"
ENV_ARTIFACT_ROOT: Final = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
ENV_INSTANCE_ID: Final = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
ENV_SUPERVISOR_PID: Final = "_ROLLBRIDGE_SUPERVISOR_PID"
"""The pid of the process that started the server: when it is gone (``kill -9``), the server
shuts down gracefully by itself (its rollouts and their sandboxes with it) instead of working
on until the next run reaps it."""
ENV_SERVER_TOKEN: Final = "_ROLLBRIDGE_ROLLOUT_SERVER_TOKEN"
"""The bearer a supervisor gives the server it starts (``serve``'s ``api_key`` when none is
passed): a sandbox that reaches the host's loopback must not drive the server (cancel every
rollout). The server takes it out of its environment, so nothing it starts inherits it."""
ENV_CHAT_COMPLETIONS_URL: Final = "OSMOSIS_CHAT_COMPLETIONS_URL"
ENV_API_KEY: Final = "OSMOSIS_API_KEY"
ENV_ROLLOUT_ID: Final = "OSMOSIS_ROLLOUT_ID"

RAW_ARGUMENTS: Final = "rollbridge_raw_arguments"
"""The ``extra`` key of a ``trajectory.json`` tool call whose ``arguments`` are ``{"raw": <text>}``
holding the model's arguments as written (not a JSON object): the trajectory's writer
(:mod:`rollout_server.trajectory`) and its readers (``eval export``) agree on it here."""

DEFAULT_RESULT_WAIT_TIMEOUT_SEC: Final = 30.0
DEFAULT_POLLING_LEASE_TIMEOUT_SEC: Final = 120.0
DEFAULT_RESULT_RETENTION_SEC: Final = 900.0


class RolloutStatus(enum.StrEnum):
    """Status of a rollout. ``unknown`` is never sent by servers; clients treat it as pending."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def is_terminal(self) -> bool:
        """True for ``success``, ``failure`` and ``cancelled``."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: Final = frozenset(
    {RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED}
)


class RolloutErrorCategory(enum.StrEnum):
    """``err_category`` values."""

    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    VALIDATION_ERROR = "validation_error"
    HTTP_ERROR = "http_error"
    AGENT_ERROR = "agent_error"
    INTERNAL_ERROR = "internal_error"


class CancelDisposition(enum.StrEnum):
    """Per-id answer of ``POST /rollout/cancel``."""

    CANCELLED_QUEUED = "cancelled_queued"
    CANCELLED_RUNNING = "cancelled_running"
    NOT_FOUND = "not_found"


def is_single_path_segment(value: str) -> bool:
    """True when ``value`` is usable as one URL path segment and one directory name.

    Rejects the empty string, ``.``, ``..``, anything containing ``/``, ``\\`` or NUL, and a
    Windows drive prefix (a ``:`` second character, as in ``C:x``): whatever is left is its own
    basename on posix and on Windows. This is the one rollout-id check of every package.
    """
    return (
        bool(value)
        and value not in (".", "..")
        and "/" not in value
        and "\\" not in value
        and "\x00" not in value
        and value[1:2] != ":"
    )


class RolloutSample(msgspec.Struct, kw_only=True):
    """The wire form of a rollout's sample (never carries ``trajectory_messages``)."""

    messages: list[dict[str, Any]] = msgspec.field(default_factory=list)
    label: str | None = None
    reward: float | None = None
    remove_sample: bool = False
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    extra_fields: dict[str, Any] = msgspec.field(default_factory=dict)


class RolloutInitRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /rollout``. Encoded with every field present (nulls included)."""

    initial_messages: list[dict[str, Any]]
    rollout_id: str
    chat_completions_url: str
    label: str | None = None
    metadata: dict[str, Any] | None = None
    llm_api_key: str | None = None
    grade: bool = True
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    extra_fields: dict[str, Any] | None = None

    def validate(self) -> None:
        """Raise :class:`RequestValidationError` when a server would answer 422."""
        parse_rollout_init_request(msgspec.to_builtins(self))


class RolloutInitResponse(msgspec.Struct, kw_only=True):
    """Body of a 202 answer to ``POST /rollout``."""

    rollout_id: str
    status: RolloutStatus
    polling_lease_token: str
    result_wait_timeout_sec: float
    polling_lease_timeout_sec: float


class RolloutResultResponse(msgspec.Struct, kw_only=True):
    """Body of ``GET /rollout/{id}/result``: all five keys are always present."""

    rollout_id: str
    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None

    @property
    def is_terminal(self) -> bool:
        """True when polling is over."""
        return self.status.is_terminal


class CancelRolloutsRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /rollout/cancel``: exactly one selector must be active."""

    ids: list[str] | None = None
    prefix: str | None = None
    all: bool = False


class CancelRolloutsResponse(msgspec.Struct, kw_only=True):
    """Body of a 200 answer to ``POST /rollout/cancel``."""

    dispositions: dict[str, CancelDisposition]


class RequestValidationError(ValueError):
    """A request body broke the protocol's rules.

    ``errors`` is a list of ``{"type", "loc", "msg", "input"}`` objects (the reference's 422
    detail shape); ``detail`` is a plain string when the error is not field-specific.
    """

    def __init__(self, errors: list[dict[str, Any]] | None = None, detail: str | None = None):
        self.errors = errors or []
        self.detail = detail
        super().__init__(detail or "; ".join(f"{e['loc']}: {e['msg']}" for e in self.errors))

    def body(self) -> dict[str, Any]:
        """The JSON body of the 422 answer."""
        return {"detail": self.detail if self.detail is not None else self.errors}


_MISSING: Final = object()


class _Checker:
    """Collects field errors while a body is validated."""

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.errors: list[dict[str, Any]] = []

    def fail(self, field: str, kind: str, msg: str, value: Any) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        self.errors.append({"type": kind, "loc": ["body", field], "msg": msg, "input": value})

    def get(self, field: str, *, required: bool) -> Any:
        value = self.body.get(field, _MISSING)
        if value is _MISSING and required:
            self.errors.append(
                {"type": "missing", "loc": ["body", field], "msg": "Field required", "input": None}
            )
        return value

    def string(self, field: str, *, required: bool = False, nullable: bool = True) -> Any:
        value = self.get(field, required=required)
        if value is _MISSING or (value is None and nullable):
            return None if value is _MISSING else value
        if not isinstance(value, str):
            self.fail(field, "string_type", "Input should be a valid string", value)
            return None
        return value

    def obj(self, field: str) -> dict[str, Any] | None:
        value = self.get(field, required=False)
        if value is _MISSING or value is None:
            return None
        if not isinstance(value, dict):
            self.fail(field, "dict_type", "Input should be a valid dictionary", value)
            return None
        return value

    def boolean(self, field: str, default: bool) -> bool:
        value = self.get(field, required=False)
        if value is _MISSING:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _BOOL_STRINGS:
            return _BOOL_STRINGS[value.lower()]
        self.fail(field, "bool_type", "Input should be a valid boolean", value)
        return default

    def seconds(self, field: str) -> float | None:
        value = self.get(field, required=False)
        if value is _MISSING or value is None:
            return None
        number: float | None = None
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if number is None:
            self.fail(field, "float_type", "Input should be a valid number", value)
            return None
        if not math.isfinite(number):
            self.fail(field, "finite_number", "Input should be a finite number", value)
            return None
        return number


_BOOL_STRINGS: Final = {
    "true": True,
    "false": False,
    "1": True,
    "0": False,
    "yes": True,
    "no": False,
    "on": True,
    "off": False,
    "t": True,
    "f": False,
    "y": True,
    "n": False,
}

_SEGMENT_MSG: Final = (
    "Value error, rollout_id must be a single path segment "
    "(no path separators, and not '.' or '..')"
)


def _not_an_object(value: Any) -> RequestValidationError:
    return RequestValidationError(
        [
            {
                "type": "model_attributes_type",
                "loc": ["body"],
                "msg": "Input should be a valid dictionary or object to extract fields from",
                "input": value if isinstance(value, str | int | bool | None) else None,
            }
        ]
    )


def parse_rollout_init_request(body: Any) -> RolloutInitRequest:
    """Validate a decoded ``POST /rollout`` body (lax, like the reference) or raise.

    ``None`` stands for a missing body.
    """
    if body is None:
        raise RequestValidationError(
            [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
        )
    if not isinstance(body, dict):
        raise _not_an_object(body)
    check = _Checker(body)
    messages = check.get("initial_messages", required=True)
    if messages is not _MISSING:
        if not isinstance(messages, list):
            check.fail("initial_messages", "list_type", "Input should be a valid list", messages)
        else:
            for index, message in enumerate(messages):
                if not isinstance(message, dict):
                    check.errors.append(
                        {
                            "type": "dict_type",
                            "loc": ["body", "initial_messages", index],
                            "msg": "Input should be a valid dictionary",
                            "input": message,
                        }
                    )
    rollout_id = check.string("rollout_id", required=True, nullable=False)
    if isinstance(rollout_id, str) and not is_single_path_segment(rollout_id):
        check.fail("rollout_id", "value_error", _SEGMENT_MSG, rollout_id)
    url = check.string("chat_completions_url", required=True, nullable=False)
    label = check.string("label")
    metadata = check.obj("metadata")
    api_key = check.string("llm_api_key")
    if api_key == "":
        check.fail(
            "llm_api_key",
            "value_error",
            "Value error, llm_api_key must be omitted or a non-empty string",
            api_key,
        )
    grade = check.boolean("grade", True)
    agent_timeout = check.seconds("agent_timeout_sec")
    grader_timeout = check.seconds("grader_timeout_sec")
    extra_fields = check.obj("extra_fields")
    if check.errors:
        raise RequestValidationError(check.errors)
    return RolloutInitRequest(
        initial_messages=messages,
        rollout_id=rollout_id,
        chat_completions_url=url,
        label=label,
        metadata=metadata,
        llm_api_key=api_key,
        grade=grade,
        agent_timeout_sec=agent_timeout,
        grader_timeout_sec=grader_timeout,
        extra_fields=extra_fields,
    )


def parse_cancel_request(body: Any) -> CancelRolloutsRequest:
    """Validate a decoded ``POST /rollout/cancel`` body or raise.

    A body without exactly one active selector raises with the string detail
    ``pass exactly one selector: ids, prefix, or all``.
    """
    if body is None:
        raise RequestValidationError(
            [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
        )
    if not isinstance(body, dict):
        raise _not_an_object(body)
    check = _Checker(body)
    ids = check.get("ids", required=False)
    if ids is _MISSING:
        ids = None
    elif ids is not None:
        if not isinstance(ids, list):
            check.fail("ids", "list_type", "Input should be a valid list", ids)
            ids = None
        else:
            for index, item in enumerate(ids):
                if not isinstance(item, str):
                    check.errors.append(
                        {
                            "type": "string_type",
                            "loc": ["body", "ids", index],
                            "msg": "Input should be a valid string",
                            "input": item,
                        }
                    )
    prefix = check.string("prefix")
    select_all = check.boolean("all", False)
    if check.errors:
        raise RequestValidationError(check.errors)
    active = (ids is not None) + (prefix is not None) + bool(select_all)
    if active != 1:
        raise RequestValidationError(detail="pass exactly one selector: ids, prefix, or all")
    return CancelRolloutsRequest(ids=ids, prefix=prefix, all=select_all)


_init_decoder: Final = msgspec.json.Decoder(RolloutInitResponse)
_result_decoder: Final = msgspec.json.Decoder(RolloutResultResponse)
_cancel_decoder: Final = msgspec.json.Decoder(CancelRolloutsResponse)


def decode_init_response(data: bytes) -> RolloutInitResponse:
    """Decode and check a 202 body: token non-empty, hold > 0, lease > hold, all finite."""
    response = _init_decoder.decode(data)
    hold = response.result_wait_timeout_sec
    lease = response.polling_lease_timeout_sec
    if not response.polling_lease_token:
        raise msgspec.ValidationError("polling_lease_token must be non-empty")
    if not (math.isfinite(hold) and hold > 0):
        raise msgspec.ValidationError("result_wait_timeout_sec must be finite and > 0")
    if not (math.isfinite(lease) and lease > hold):
        raise msgspec.ValidationError(
            "polling_lease_timeout_sec must be finite and > result_wait_timeout_sec"
        )
    return response


def decode_result_response(data: bytes) -> RolloutResultResponse:
    """Decode a result body (all five keys; unknown keys ignored)."""
    return _result_decoder.decode(data)


def decode_cancel_response(data: bytes) -> CancelRolloutsResponse:
    """Decode a cancel body."""
    return _cancel_decoder.decode(data)


def sdk_version() -> str:
    """The installed rollbridge version (what :data:`SDK_VERSION_HEADER` carries), or
    ``"unknown"``.

    The ``Version`` field of the first ``rollbridge`` distribution in a ``sys.path`` directory,
    found the way :mod:`importlib.metadata` finds it, read without importing that module: it
    and the email parser it reads metadata with cost a server's start-up about as much CPU as
    its HTTP stack. What this plain reading does not cover (no such directory: a zip on the
    path, or no distribution at all; metadata without a ``Version`` line) is left to
    :mod:`importlib.metadata`.
    """
    for entry in sys.path:
        info = _distribution_in(entry or ".")
        if info is not None:
            version = _metadata_version(info)
            if version is not None:
                return version
            break
    from importlib import metadata

    try:
        # (A distribution without a Version field reads as None there.)
        return metadata.version("rollbridge") or "unknown"
    except (metadata.PackageNotFoundError, KeyError):  # KeyError: importlib_metadata, no Version
        return "unknown"


def _distribution_in(directory: str) -> str | None:
    """The path of a ``rollbridge`` ``.dist-info``/``.egg-info`` in ``directory`` (names
    compared as :mod:`importlib.metadata` compares them), or None."""
    try:
        names = os.listdir(directory)
    except OSError:  # not a directory (a zip, a missing entry)
        return None
    for name in names:
        low = name.lower()
        if low.endswith((".dist-info", ".egg-info")):
            project = low.rpartition(".")[0].partition("-")[0]
            if re.sub(r"[-_.]+", "_", project) == "rollbridge":
                return os.path.join(directory, name)
    return None


def _metadata_version(info: str) -> str | None:
    """The ``Version`` field of a distribution's ``METADATA`` (or ``PKG-INFO``), or None."""
    for file in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info, file), encoding="utf-8") as stream:
                text = stream.read()
        except OSError:
            continue
        # The RFC 822 header block (up to the first empty line), read as the email parser
        # reads it: field names are case-insensitive, the first one counts, a value loses
        # its leading blanks.
        for line in text.splitlines():
            if not line:
                break
            name, colon, value = line.partition(":")
            if colon and name.lower() == "version":
                return value.lstrip(" \t")
        return None
    return None


# -- /health ------------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    """An int that is not a bool (JSON ``true`` decodes to one), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    number = _int(value)
    return number if number is not None and number >= 0 else None


@dataclass(frozen=True, kw_only=True)
class ChatEndpoint:
    """``chat_endpoint``: where the backend's sandboxes run and whether they need a public URL
    for the chat endpoint (they cannot reach this machine's loopback)."""

    environment: str | None = None
    requires_public_url: bool | None = None
    probe: str | None = None
    """The path of the server's sandbox probe route (``POST``), when its sandboxes want the
    supervisor to find how they reach the bridge before dispatch (rollout_server.probe_route)."""


@dataclass(frozen=True, kw_only=True)
class HealthReport:
    """A ``/health`` answer, read leniently: a missing field, or one of the wrong type, is None.

    Both shapes servers send are covered: a LocalBackend reports ``concurrency {max_concurrent,
    queued, running}``; a sandbox backend reports ``backend``, ``agent``, ``in_flight``,
    ``running``, ``queued``, ``max_queue_depth`` and ``chat_endpoint`` at the top level. Every
    server adds ``instance_id``, ``process_id`` and ``lifecycle {accepting_rollouts,
    active_rollouts}``. ``body`` keeps the decoded object for anything not named here.
    """

    body: Mapping[str, Any] = field(default_factory=dict, repr=False)
    status: str | None = None
    instance_id: str | None = None
    """From the :data:`INSTANCE_ID_HEADER` header, else the body."""
    process_id: str | None = None
    """The server process's identity (changes on restart); a non-empty string or None."""
    sdk_version: str | None = None
    """From the :data:`SDK_VERSION_HEADER` header."""
    accepting_rollouts: bool | None = None
    active_rollouts: int | None = None
    backend: str | None = None
    agent: str | None = None
    in_flight: int | None = None
    running: int | None = None
    queued: int | None = None
    max_queue_depth: int | None = None
    max_concurrent: int | None = None
    """``concurrency.max_concurrent``."""
    chat_endpoint: ChatEndpoint | None = None

    @classmethod
    def parse(cls, body: object, headers: Mapping[str, str] | None = None) -> HealthReport | None:
        """Read a decoded ``/health`` body; None when it is not a JSON object. Never raises.

        ``headers`` are the response headers (any case-insensitive mapping, e.g. httpx's).
        """
        if not isinstance(body, Mapping):
            return None
        headers = headers or {}
        lifecycle = body.get("lifecycle")
        lifecycle = lifecycle if isinstance(lifecycle, Mapping) else {}
        concurrency = body.get("concurrency")
        concurrency = concurrency if isinstance(concurrency, Mapping) else {}
        endpoint = body.get("chat_endpoint")
        return cls(
            body=body,
            status=_text(body.get("status")),
            instance_id=_text(headers.get(INSTANCE_ID_HEADER) or body.get("instance_id")),
            process_id=_text(body.get("process_id")) or None,
            sdk_version=_text(headers.get(SDK_VERSION_HEADER)),
            accepting_rollouts=_flag(lifecycle.get("accepting_rollouts")),
            active_rollouts=_count(lifecycle.get("active_rollouts")),
            backend=_text(body.get("backend")),
            agent=_text(body.get("agent")),
            in_flight=_count(body.get("in_flight")),
            running=_count(body.get("running")),
            queued=_count(body.get("queued")),
            # Kept as sent, even when not positive (that means "no cap"; see `capacity`).
            max_queue_depth=_int(body.get("max_queue_depth")),
            max_concurrent=_int(concurrency.get("max_concurrent")),
            chat_endpoint=(
                ChatEndpoint(
                    environment=_text(endpoint.get("environment")),
                    requires_public_url=_flag(endpoint.get("requires_public_url")),
                    probe=_text(endpoint.get("probe")) or None,
                )
                if isinstance(endpoint, Mapping)
                else None
            ),
        )

    @classmethod
    def from_json(
        cls, data: bytes | str, headers: Mapping[str, str] | None = None
    ) -> HealthReport | None:
        """Decode and read a ``/health`` body; None when it is not a JSON object."""
        try:
            body = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return None
        return cls.parse(body, headers)

    @property
    def capacity(self) -> int | None:
        """The server's concurrency cap: ``max_queue_depth``, else
        ``concurrency.max_concurrent``; only a positive int counts (None: no cap)."""
        for value in (self.max_queue_depth, self.max_concurrent):
            if value is not None and value > 0:
                return value
        return None

    @property
    def requires_public_url(self) -> bool:
        """True only when ``chat_endpoint.requires_public_url`` is exactly JSON ``true``."""
        return self.chat_endpoint is not None and self.chat_endpoint.requires_public_url is True

    @property
    def chat_probe(self) -> str | None:
        """``chat_endpoint.probe``: the probe route's path when it is an absolute path."""
        probe = self.chat_endpoint.probe if self.chat_endpoint is not None else None
        return probe if probe is not None and probe.startswith("/") else None

    @property
    def chat_environment(self) -> str | None:
        """``chat_endpoint.environment`` when it is a string (as sent, not stripped)."""
        return self.chat_endpoint.environment if self.chat_endpoint is not None else None
