"""The fast canonical JSON path (msgspec) writes exactly the bytes of the stdlib path it stands
in for: the journal, ``logs.txt`` details and every other canonical JSON keep their bytes
(the reference reads our run directories). Anything msgspec would write differently, or
accept where the stdlib refuses, takes the stdlib path."""

from __future__ import annotations

import enum
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.rundir.atomic import canonical_json, canonical_json_bytes, fast_sorted_json
from launcher.rundir.journal import ErrorInfo, TerminalRecord
from launcher.rundir.logs import _details_json, utc_now_iso


def stdlib_canonical(obj: Any) -> bytes:
    """The canonical JSON as it was written before the fast path, bytes included."""
    text = json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8", "backslashreplace")


def stdlib_details(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)


def outcome(fn: Any, obj: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(obj))
    except Exception as exc:  # the same refusal, whatever it is
        return ("raised", type(exc))


# Every code point, lone surrogates included; floats of every magnitude, NaN and infinities.
texts = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=-1e7, max_value=1e7)
    | texts
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=1500, deadline=None)
@given(documents)
def test_fast_path_is_byte_identical_to_the_stdlib(obj: Any) -> None:
    assert outcome(canonical_json_bytes, obj) == outcome(stdlib_canonical, obj)
    text = outcome(canonical_json, obj)
    reference = outcome(stdlib_canonical, obj)
    if reference[0] == "ok":
        assert text[0] == "ok"
        assert text[1].encode("utf-8", "backslashreplace") == reference[1]
    else:
        assert text == reference
    assert outcome(_details_json, obj) == outcome(stdlib_details, obj)


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    HIGH = 3


class Name(enum.StrEnum):
    A = "a"


class MyFloat(float):
    def __repr__(self) -> str:
        return "MyFloat!"


@pytest.mark.parametrize(
    "obj",
    [
        {"b": 1, "a": "é", "c": None, "d": [True, False, 1.5]},
        {"x": 1e16, "y": 1e-5, "z": 0.0001, "w": 9999999999999998.0, "v": -0.0, "u": 5e-324},
        {"x": 1.7976931348623157e308, "y": -2.5e-300, "z": 123456789.123456789},
        {"nan": float("nan")},
        {"inf": float("inf")},
        {"lone": "\ud800", "pair": "\U0001f600", "ctl": '\x00\x1f\x7f\u2028\u2029"\\'},
        {"\udcff": 1},
        {"big": 2**64, "bigger": -(2**200), "edge": 2**63 - 1, "over": 2**63},
        {1: "int key"},
        {None: 1, "a": 2},
        {"tuple": (1, "two", 3.0)},
        {"enum": Color.RED},
        {"intenum": Level.HIGH, "strenum": Name.A},
        {"sub": MyFloat(2.5)},
        {"when": datetime(2026, 1, 1, tzinfo=UTC)},
        {"id": uuid.UUID(int=1)},
        {"bytes": b"x"},
        {"set": {1}},
        [1, {"b": 2, "a": [{"d": 1, "c": 2}]}],
        "top-level text",
        3.25,
        {"deep": [[[[[[[[[[{"k": "v"}]]]]]]]]]]},
    ],
)
def test_the_cases_msgspec_could_write_differently(obj: Any) -> None:
    assert outcome(canonical_json_bytes, obj) == outcome(stdlib_canonical, obj)
    assert outcome(_details_json, obj) == outcome(stdlib_details, obj)


def test_the_fast_path_declines_what_it_cannot_match() -> None:
    assert fast_sorted_json({"a": 1.0, "b": "x"}) == b'{"a":1.0,"b":"x"}'
    for odd in (
        {"x": 1e16},
        {"x": float("nan")},
        {"x": "\ud800"},
        {1: 2},
        {"x": Color.RED},
        {"x": MyFloat(1.0)},
        {"x": 2**63},
    ):
        assert fast_sorted_json(odd) is None
    cycle: list[Any] = []
    cycle.append(cycle)
    assert fast_sorted_json(cycle) is None
    with pytest.raises(ValueError):
        canonical_json(cycle)
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def reference_dict(record: TerminalRecord) -> dict[str, Any]:
    """``TerminalRecord.to_dict`` as it was written before it was made faster."""
    out: dict[str, Any] = {}
    for name in record.__struct_fields__:
        value = getattr(record, name)
        if isinstance(value, ErrorInfo):
            out[name] = value.to_json()
        elif value is not None:
            out[name] = value
    duration = float(record.duration_ms or 0.0)
    out["duration_ms"] = duration if math.isfinite(duration) else 0.0
    out.pop("reward", None)
    if record.reward is not None and math.isfinite(float(record.reward)):
        out["reward"] = float(record.reward)
    return out


def stdlib_line(record: TerminalRecord) -> bytes:
    return (
        json.dumps(
            reference_dict(record),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
        + "\n"
    ).encode("utf-8", "backslashreplace")


optional_ints = st.none() | st.integers(min_value=0, max_value=2**66)
records = st.builds(
    TerminalRecord,
    row_index=st.integers(min_value=0, max_value=2**40),
    run_index=st.integers(min_value=0, max_value=50),
    rollout_id=st.just(uuid.uuid4().hex) | st.text("abcdef0123456789é-_", min_size=1),
    status=st.sampled_from(["success", "failed", "skipped"]),
    source_row_index=optional_ints,
    reward=st.none() | st.floats(allow_nan=True, allow_infinity=True),
    tokens=optional_ints,
    max_context_tokens=optional_ints,
    retries=optional_ints,
    duration_ms=st.none() | st.floats(allow_nan=True, allow_infinity=True),
    error_type=st.none() | texts,
    error=st.none()
    | st.builds(
        ErrorInfo,
        phase=st.sampled_from(["agent", "bridge"]),
        message=texts,
        type=st.none() | texts,
        status=st.none() | st.integers(min_value=100, max_value=599),
    ),
)


@settings(max_examples=800, deadline=None)
@given(records)
def test_journal_lines_keep_their_bytes(record: TerminalRecord) -> None:
    if record.rollout_id.startswith("."):
        return
    assert list(record.to_dict().items()) == list(reference_dict(record).items())
    assert record.to_line() == stdlib_line(record)


def test_a_journal_line_with_a_lone_surrogate_keeps_its_escape() -> None:
    record = TerminalRecord(
        row_index=1,
        run_index=0,
        rollout_id="r1",
        status="failed",
        error_type="bad \udc80 text",
        duration_ms=12.5,
    )
    line = record.to_line()
    assert line == stdlib_line(record)
    assert json.loads(line)["error_type"] == "bad \udc80 text"


def test_the_per_second_timestamp_matches_datetime_now() -> None:
    def reference() -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    for _ in range(2000):
        before, now, after = reference(), utc_now_iso(), reference()
        assert before <= now <= after
        assert len(now) == len(before)
    moment = datetime(2026, 8, 20, 12, 34, 56, 7, tzinfo=UTC)
    assert utc_now_iso(moment) == "2026-08-20T12:34:56.000007Z"
