"""bridge.codec against the standard library: the same values, bytes and exceptions."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.codec import dumps, loads


def _reference_dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _outcome(call: Any, *args: Any) -> tuple[str, str]:
    try:
        # repr tells 1 from 1.0 from True and keeps key order: a type-exact comparison.
        return "value", repr(call(*args))
    except Exception as exc:
        return "error", type(exc).__name__


class Text(str):
    pass


class Number(int):
    pass


keys = st.text(max_size=6)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats()
    | st.sampled_from([1e16, 1e-5, 1e-4, 9.999e15, 1e308, 5e-324, -0.0, 0.1, 1e400, -1e400])
    | st.text(max_size=8)
    | st.sampled_from(["\ud800", "a\udfffb", "\u2028", "\x00\x1f\x7f", '"\\/'])
)
odd = st.sampled_from([Text("x"), Number(3), (1, 2), {1: "int key"}, {None: 1}, {1.5: 2}])
values = st.recursive(
    scalars | odd,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=600, deadline=None)
@given(values)
def test_dumps_writes_what_json_writes(obj: Any) -> None:
    assert _outcome(dumps, obj) == _outcome(_reference_dumps, obj)


@settings(max_examples=600, deadline=None)
@given(values)
def test_loads_reads_what_json_reads(obj: Any) -> None:
    try:
        text = json.dumps(obj, ensure_ascii=False)
    except (ValueError, TypeError):
        return
    for data in (text, text.encode("utf-8", "surrogatepass"), json.dumps(obj).encode()):
        assert _outcome(loads, data) == _outcome(json.loads, data)


fragments = st.sampled_from(
    [
        "{", "}", "[", "]", ",", ":", '"', "\\", "\\u", "d800", "dc00", "00", "e", "E", "+", "-",
        ".", "0", "1", "9", "NaN", "Infinity", "-Infinity", "true", "null", " ", "\t", "\n",
        "\x01", "\x7f", "\ufeff", "é", "\U0001f600", "1e400", "1" * 30, '"a"', "{}", "[]",
    ]
)  # fmt: skip


@settings(max_examples=1200, deadline=None)
@given(st.lists(fragments, max_size=12), st.sampled_from(["utf-8", "utf-16", "utf-32", None]))
def test_loads_agrees_on_arbitrary_text(parts: list[str], encoding: str | None) -> None:
    text = "".join(parts)
    data: bytes | str = text if encoding is None else text.encode(encoding, "surrogatepass")
    assert _outcome(loads, data) == _outcome(json.loads, data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=24))
def test_loads_agrees_on_arbitrary_bytes(data: bytes) -> None:
    assert _outcome(loads, data) == _outcome(json.loads, data)


def test_the_cases_where_msgspec_differs_go_to_json() -> None:
    assert (
        dumps({"a": 1e16, "b": 1e-05, "c": float("inf")}) == b'{"a":1e+16,"b":1e-05,"c":Infinity}'
    )
    assert repr(loads(b'[NaN, 1e400, "\\ud800"]')) == repr([float("nan"), float("inf"), "\ud800"])
    assert loads(b"\xef\xbb\xbf[1]") == [1]
    assert loads('[1, "é"]'.encode("utf-16")) == [1, "é"]
    huge = b"1" * 5000  # past int's conversion limit: json's ValueError, not msgspec's error
    assert _outcome(loads, huge) == _outcome(json.loads, huge) == ("error", "ValueError")
    assert _outcome(dumps, 10**5000) == _outcome(_reference_dumps, 10**5000)
