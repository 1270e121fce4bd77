"""The socket protocol between the supervisor and the bridge's own process (described in
:mod:`bridge.process`): one JSON array per line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from bridge.apis import ApiOptions
from bridge.retry import RetryPolicy
from bridge.server import BridgeConfig

__all__ = ["config_message", "encode_line", "read_config", "split_lines"]

_ENCODE: Final = msgspec.json.Encoder().encode
_DECODE: Final = msgspec.json.Decoder(list[Any]).decode


def encode_line(item: list[Any]) -> bytes:
    """One message of the socket protocol: a JSON array and a newline."""
    return _ENCODE(item) + b"\n"


def split_lines(buffer: bytearray) -> list[list[Any]]:
    """Take every complete line out of ``buffer`` (a partial last line stays) and decode it."""
    end = buffer.rfind(b"\n")
    if end < 0:
        return []
    chunk = bytes(buffer[:end])
    del buffer[: end + 1]
    return [_DECODE(line) for line in chunk.split(b"\n")]


def _hex_text(text: str) -> str:
    # Any str, lone surrogates included (JSON cannot carry those).
    return text.encode("utf-8", "surrogatepass").hex()


def _unhex_text(hexed: str) -> str:
    return bytes.fromhex(hexed).decode("utf-8", "surrogatepass")


def config_message(
    config: BridgeConfig, redact_values: Iterable[str], environ: Mapping[bytes, bytes]
) -> list[Any]:
    """The child's configuration as the socket's first message; :func:`read_config` is its
    inverse. The environment crosses as bytes (a value need not be UTF-8), without Ray's
    variables (its cluster token among them): nothing the bridge uses, and the bridge's is the
    process that faces the tunnel."""
    retry = config.retry
    return [
        "c",
        {
            "model": config.model,
            "token": config.token,
            "host": config.host,
            "port": config.port,
            "keepalive": config.keepalive,
            "plain_chat_route": config.plain_chat_route,
            "per_rollout_bearers": config.per_rollout_bearers,
            "via_litellm": config.via_litellm,
            "upstream_http2": config.upstream_http2,
            "heartbeat_interval": config.heartbeat_interval,
            "keepalive_grace": config.keepalive_grace,
            "keepalive_interval": config.keepalive_interval,
            "max_body_bytes": config.max_body_bytes,
            "probe_key": (config.probe_key or b"").hex(),
            "redact": sorted(_hex_text(value) for value in redact_values),
            "retry": None
            if retry is None
            else [retry.max_attempts, retry.base_delay, retry.max_delay, retry.budget],
            "env": [
                [name.hex(), value.hex()]
                for name, value in environ.items()
                if not name.startswith(b"RAY_")
            ],
            "apis": None
            if config.apis is None
            else [list(config.apis.hosted_tools), config.apis.responses, config.apis.messages],
        },
    ]


def read_config(
    doc: dict[str, Any],
) -> tuple[dict[str, Any], list[str], list[tuple[bytes, bytes]]]:
    """The :class:`BridgeConfig` fields that crossed (the callables do not), the redact values
    and the environment of a :func:`config_message` document."""
    retry = doc["retry"]
    fields = {
        key: doc[key]
        for key in (
            "model",
            "token",
            "host",
            "port",
            "keepalive",
            "plain_chat_route",
            "per_rollout_bearers",
            "via_litellm",
            "upstream_http2",
            "heartbeat_interval",
            "keepalive_grace",
            "keepalive_interval",
            "max_body_bytes",
        )
    }
    fields["probe_key"] = bytes.fromhex(doc["probe_key"]) or None
    fields["retry"] = None if retry is None else RetryPolicy(*retry)
    apis = doc.get("apis")
    fields["apis"] = None if apis is None else ApiOptions(tuple(apis[0]), apis[1], apis[2])
    redact = [_unhex_text(value) for value in doc["redact"]]
    environ = [(bytes.fromhex(name), bytes.fromhex(value)) for name, value in doc["env"]]
    return fields, redact, environ
