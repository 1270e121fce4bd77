"""The bridge's JSON: the standard library's results and bytes, from msgspec where that is sure.

Each call decodes a request and a provider answer and encodes a provider request and an answer;
with :mod:`json` those four were about a tenth of the bridge's CPU per call, with msgspec a
fraction of that. What goes on the wire stays exactly what :mod:`json` makes of it:

* :func:`loads` takes msgspec's result when msgspec decodes the input at all. Where msgspec
  and :mod:`json` differ, msgspec refuses: ``NaN``/``Infinity`` and numbers beyond a float's
  range, integers of more digits than ``int`` converts, lone surrogates (escaped, or in a
  ``str`` given), a byte-order mark, UTF-16/32 and invalid UTF-8. Then :mod:`json` decodes
  the input (or raises) as it always did. (Nesting at the interpreter's
  recursion limit, where :mod:`json`'s own threshold already moves with the caller's stack
  depth, is the one place the two may part by a few levels.)
* :func:`dumps` writes with msgspec only a value whose every part msgspec renders as
  ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))`` does: dicts with ``str``
  keys, lists, tuples, ``str``, ``bool``, ``None``, 64-bit ``int`` and finite ``float`` in
  the range where ``repr`` uses no exponent, all of exactly those types
  (:func:`rollout_server.net.jsonbytes.renders_like_json`); anything else, and anything
  msgspec refuses (a lone surrogate), is written by :mod:`json`, errors included.

``tests/bridge/test_codec.py`` holds both against :mod:`json` over generated values.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from bridge.errors import UpstreamError
from rollout_server.net.jsonbytes import renders_like_json

__all__ = ["NotSendable", "dumps", "loads", "loads_request", "parse_provider_json"]

_DECODE: Final = msgspec.json.Decoder().decode
_ENCODE: Final = msgspec.json.Encoder().encode
_JSON: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def loads(data: bytes | str) -> Any:
    """``json.loads(data)``: the same value, or the same exception."""
    try:
        return _DECODE(data)
    except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
        return json.loads(data)


class NotSendable(ValueError):
    """JSON text that :mod:`json` reads but whose value cannot be sent on as JSON."""


def loads_request(data: bytes) -> Any:
    """:func:`loads` for a request the bridge will send on: the same value, except that
    ``NaN``/``Infinity`` (not JSON: a provider would get them as written) and a lone surrogate
    escape (UTF-8 cannot encode it, so the call would fail on its way out) raise
    :class:`NotSendable`. A BOM, UTF-16/32 and integers past 64 bits stay accepted, as
    :mod:`json` reads them. Only input msgspec refuses takes the slower checks."""
    try:
        return _DECODE(data)
    except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
        pass

    def constant(name: str) -> Any:
        raise NotSendable(f"{name} is not JSON")

    value = json.loads(data, parse_constant=constant)
    try:
        _JSON.encode(value).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotSendable(
            "a string holds a lone surrogate escape, which UTF-8 cannot carry"
        ) from exc
    return value


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON: ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))``
    encoded as UTF-8, byte for byte (and the same exception where that raises)."""
    try:
        if renders_like_json(obj):
            return _ENCODE(obj)
    except (RecursionError, UnicodeEncodeError, TypeError, ValueError, OverflowError):
        pass  # json decides, and raises its own error where it fails too
    return _JSON.encode(obj).encode("utf-8")


def parse_provider_json(text: str) -> Any:
    """A provider's JSON text; :class:`~bridge.errors.UpstreamError` (502) when it is not JSON."""
    try:
        return loads(text)
    except ValueError as exc:
        raise UpstreamError(502, f"provider returned invalid JSON: {text[:200]}") from exc
