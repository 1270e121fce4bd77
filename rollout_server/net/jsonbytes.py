"""When msgspec's JSON bytes are exactly the standard library's.

Encoding with msgspec costs a fraction of :mod:`json`, but the two write some values
differently, and where bytes are compared or hashed (the run directory's canonical JSON, what
the bridge sends on) only identical output will do. :func:`renders_like_json` says whether
msgspec writes a value as ``json.dumps`` with compact separators and ``ensure_ascii=False``
does (with ``sort_keys=True`` for msgspec's ``order="sorted"``): dicts with ``str`` keys,
lists, tuples, ``str``, ``bool``, ``None``, 64-bit ``int`` and finite ``float`` in the range
where ``repr`` uses no exponent (msgspec writes ``1e16`` and ``1e-05`` its own way), all of
exactly those types, because a subclass may render differently or be refused by one and not
the other. A ``str`` holding a lone surrogate passes the check, and msgspec then refuses it
(``UnicodeEncodeError``), so callers fall back to :mod:`json` on that error too.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["renders_like_json"]

_INT64: Final = 1 << 63


def renders_like_json(obj: Any) -> bool:
    """Whether msgspec encodes ``obj`` byte for byte as :mod:`json` does (module docstring)."""
    kind = type(obj)
    if kind is str or kind is bool or obj is None:
        return True
    if kind is int:
        return bool(-_INT64 <= obj < _INT64)
    if kind is float:
        return bool(obj == 0.0 or 1e-4 <= abs(obj) < 1e16)  # NaN and infinity fail both
    if kind is dict:
        return all(type(key) is str for key in obj) and all(map(renders_like_json, obj.values()))
    if kind is list or kind is tuple:
        return all(map(renders_like_json, obj))
    return False
