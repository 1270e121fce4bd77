"""The socket protocol between the supervisor and the bridge's own process (described in
:mod:`bridge.process`): one JSON array per line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from bridge.server import BridgeConfig

__all__ = ["config_message", "encode_line", "environ_message", "hex_text", "split_lines"]

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


def hex_text(text: str) -> str:
    """``text`` as hex of its UTF-8 bytes, lone surrogates included (JSON cannot carry those)."""
    return text.encode("utf-8", "surrogatepass").hex()


def environ_message(environ: Mapping[bytes, bytes]) -> list[list[str]]:
    """The environment as ``[[hex name, hex value], ...]``: bytes, which need not be UTF-8."""
    return [[name.hex(), value.hex()] for name, value in environ.items()]


def config_message(config: BridgeConfig, redact_values: Iterable[str]) -> list[Any]:
    """The child's configuration as the socket's first message."""
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
            "via_litellm": config.via_litellm,
            "heartbeat_interval": config.heartbeat_interval,
            "keepalive_grace": config.keepalive_grace,
            "keepalive_interval": config.keepalive_interval,
            "max_body_bytes": config.max_body_bytes,
            "probe_key": (config.probe_key or b"").hex(),
            "redact": sorted(hex_text(value) for value in redact_values),
            "retry": None
            if retry is None
            else [retry.max_attempts, retry.base_delay, retry.max_delay, retry.budget],
        },
    ]
