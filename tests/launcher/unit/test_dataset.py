"""Dataset readers, row normalization, --rows, limit, dataset_rows.jsonl (docs/spec/supervisor.md §5)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launcher.dataset import (
    compact_selector,
    dataset_rows_jsonl,
    normalize_row,
    parse_rows_selector,
    select_rows,
)
from launcher.errors import CLIError


def jsonl(tmp_path: Path, rows: list, name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def msg(err: pytest.ExceptionInfo[CLIError]) -> str:
    return err.value.message


def test_jsonl_blank_lines_are_not_counted(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"user_prompt": "a", "ground_truth": "1"}\n\n   \n{"user_prompt": "b", "label": 2}\n'
    )
    sel = select_rows(path)
    assert sel.total_dataset_rows == 2
    assert [(r.row_index, r.source_row_index, r.label) for r in sel.rows] == [
        (0, 0, "1"),
        (1, 1, "2"),
    ]
    assert sel.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sel.selected_source_rows == "0-1"


def test_jsonl_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"user_prompt": "a", "ground_truth": "1"}\n\n{oops\n')
    with pytest.raises(CLIError) as err:
        select_rows(path)
    assert msg(err).startswith(f"{path}:3: invalid JSON (")
    path.write_text("[1, 2]\n")
    with pytest.raises(CLIError) as err:
        select_rows(path)
    assert msg(err) == f"{path}:1: each line must be a JSON object"


def test_csv_reader(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text(
        'system_prompt,user_prompt,ground_truth,other\n"be nice","hi, there",42,x\n,second,"",y,overflow\n',
        encoding="utf-8",
    )
    with pytest.raises(CLIError) as err:
        select_rows(path)
    assert (
        msg(err)
        == "row 1: ground_truth (or label) is required for a dataset with no 'metadata' column"
    )
    sel = select_rows(path, rows="0")
    assert sel.rows[0].initial_messages == [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi, there"},
    ]
    assert sel.rows[0].label == "42"
    assert sel.total_dataset_rows == 2
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(CLIError) as err:
        select_rows(empty)
    assert msg(err) == f"{empty} has no CSV header row"


def test_parquet_reader(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    table = pa.table(
        {
            "user_prompt": ["a", "b", "c"],
            "ground_truth": ["1", "2", None],
            "metadata": ['{"k": 1}', None, '{"z": 2, "a": [1]}'],
        }
    )
    pq.write_table(table, path)
    sel = select_rows(path)
    assert sel.total_dataset_rows == 3
    assert [r.metadata for r in sel.rows] == [{"k": 1}, None, {"z": 2, "a": [1]}]
    assert [r.label for r in sel.rows] == ["1", "2", None]
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(CLIError, match="is not a readable Parquet file"):
        select_rows(broken)


def test_parquet_without_pyarrow_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(CLIError) as err:
        select_rows(tmp_path / "x.parquet")
    assert err.value.code == "DEPENDENCY"
    assert "pip install" in msg(err) and "parquet" in msg(err)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"ground_truth": "x"},
            "row 7: user_prompt is required for a dataset with no 'metadata' column",
        ),
        (
            {"user_prompt": ""},
            "row 7: user_prompt is required for a dataset with no 'metadata' column",
        ),
        (
            {"user_prompt": "q"},
            "row 7: ground_truth (or label) is required for a dataset with no 'metadata' column",
        ),
        (
            {"user_prompt": "q", "ground_truth": ""},
            "row 7: ground_truth (or label) is required for a dataset with no 'metadata' column",
        ),
        (
            {"metadata": None},
            "row 7: has no prompt and no metadata; a row needs at least a user_prompt or a non-empty 'metadata' object",
        ),
        (
            {"metadata": {}},
            "row 7: has no prompt and no metadata; a row needs at least a user_prompt or a non-empty 'metadata' object",
        ),
        (
            {"metadata": "  "},
            "row 7: has no prompt and no metadata; a row needs at least a user_prompt or a non-empty 'metadata' object",
        ),
        (
            {"metadata": "{}"},
            "row 7: has no prompt and no metadata; a row needs at least a user_prompt or a non-empty 'metadata' object",
        ),
        ({"metadata": 5}, "row 7: metadata must be a JSON object"),
        ({"metadata": "[1]"}, "row 7: metadata must be a JSON object"),
    ],
)
def test_bad_rows(raw: dict, message: str) -> None:
    with pytest.raises(CLIError) as err:
        normalize_row(raw, 7)
    assert msg(err) == message


def test_metadata_bad_json_message() -> None:
    with pytest.raises(CLIError) as err:
        normalize_row({"metadata": "{nope"}, 3)
    assert msg(err).startswith("row 3: metadata is not valid JSON (")


def test_normalization_values() -> None:
    row = normalize_row({"user_prompt": 42, "label": True, "ground_truth": None, "extra": 1}, 0)
    assert row.user_prompt == "42" and row.label == "True" and row.metadata is None
    row = normalize_row({"user_prompt": "q", "ground_truth": 1.0, "label": "ignored"}, 0)
    assert row.label == "1.0"
    row = normalize_row({"metadata": ' {"a": 1} '}, 0)
    assert row.metadata == {"a": 1} and row.initial_messages == [] and row.label is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3", [(3, 3)]),
        ("3,7,10-12", [(3, 3), (7, 7), (10, 12)]),
        (" 5-5,1,1 ", [(1, 1), (5, 5)]),
        ("0-2,1-3", [(0, 3)]),
        ("4,0-2,3", [(0, 4)]),
    ],
)
def test_rows_selector(text: str, expected: list[tuple[int, int]]) -> None:
    assert parse_rows_selector(text) == expected


@pytest.mark.parametrize("text", ["", "3, 7", "a", "1-", "-1", "1,,2", "1-2-3"])
def test_rows_selector_syntax_errors(text: str) -> None:
    with pytest.raises(CLIError) as err:
        parse_rows_selector(text)
    assert msg(err) == (
        f"--rows must be comma-separated indices or ranges, for example '3,7,10-20': got '{text}'"
    )


def test_rows_selector_inverted() -> None:
    with pytest.raises(CLIError) as err:
        parse_rows_selector("1,20-10")
    assert msg(err) == "--rows range '20-10' is inverted; write it as 10-20"


def test_compact_selector() -> None:
    assert compact_selector([]) == ""
    assert compact_selector([5, 0, 1, 2, 2, 9, 10]) == "0-2,5,9-10"


def rows(n: int) -> list[dict]:
    return [{"user_prompt": f"q{i}", "ground_truth": str(i)} for i in range(n)]


def test_limit_and_rows_selection(tmp_path: Path) -> None:
    path = jsonl(tmp_path, rows(10))
    assert len(select_rows(path).rows) == 10
    sel = select_rows(path, limit=3)
    assert [r.source_row_index for r in sel.rows] == [0, 1, 2] and sel.total_dataset_rows == 10
    assert len(select_rows(path, limit=0).rows) == 10
    assert len(select_rows(path, limit=-4).rows) == 10
    sel = select_rows(path, rows="8,2-3", limit=1)
    assert [(r.row_index, r.source_row_index) for r in sel.rows] == [(0, 2), (1, 3), (2, 8)]
    assert sel.selected_source_rows == "2-3,8"
    with pytest.raises(CLIError) as err:
        select_rows(path, rows="9-11")
    assert msg(err) == "--rows selects [10, 11] but d.jsonl has 10 rows (valid indices are 0-9)"


def test_bad_unselected_rows_are_not_checked_but_selected_ones_are(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [*rows(2), {"nothing": 1}])
    assert len(select_rows(path, limit=2).rows) == 2
    with pytest.raises(CLIError) as err:
        select_rows(path)
    assert msg(err) == "row 2: user_prompt is required for a dataset with no 'metadata' column"


def test_a_bad_selected_row_is_reported_after_the_whole_file_was_read(tmp_path: Path) -> None:
    # Rows are normalized while the file is read; the errors keep their order: an
    # out-of-range --rows first, then the first selected row that does not normalize.
    path = jsonl(tmp_path, [{"nothing": 1}, *rows(2), {"user_prompt": "x"}])
    with pytest.raises(CLIError) as err:
        select_rows(path, rows="0,3,7")
    assert msg(err) == "--rows selects [7] but d.jsonl has 4 rows (valid indices are 0-3)"
    with pytest.raises(CLIError) as err:
        select_rows(path, rows="0,3")
    assert msg(err) == "row 0: user_prompt is required for a dataset with no 'metadata' column"
    with pytest.raises(CLIError) as err:
        select_rows(path, rows="1-3")
    assert msg(err) == (
        "row 3: ground_truth (or label) is required for a dataset with no 'metadata' column"
    )


def test_empty_selection(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n\n")
    with pytest.raises(CLIError) as err:
        select_rows(path)
    assert msg(err) == f"{path} selected no rows"


def test_dataset_rows_jsonl_shape_and_truncation(tmp_path: Path) -> None:
    long_prompt = "é" * 2500
    path = jsonl(
        tmp_path,
        [
            {"system_prompt": "sys", "user_prompt": long_prompt, "ground_truth": "g" * 600},
            {"metadata": {"z": "ü", "a": 1}},
            {"user_prompt": "q", "metadata": {"b": 2}, "label": "L"},
        ],
    )
    data = dataset_rows_jsonl(select_rows(path).rows)
    lines = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    assert list(lines[0]) == ["row_index", "prompt", "label"]
    assert lines[0]["prompt"] == "é" * 2000 and lines[0]["label"] == "g" * 500
    assert lines[1] == {"row_index": 1, "prompt": '{"a": 1, "z": "ü"}'}
    assert lines[2] == {"row_index": 2, "prompt": "q", "label": "L"}
    assert "ü".encode() in data  # UTF-8 text kept, not \\u-escaped
    assert data.endswith(b"\n")


def test_dataset_rows_jsonl_is_byte_identical_across_reads(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [{"metadata": {"b": [1, {"y": 2, "x": 1}], "a": None}}, *rows(3)])
    first = dataset_rows_jsonl(select_rows(path, rows="0,2").rows)
    second = dataset_rows_jsonl(select_rows(path, rows="2,0").rows)
    assert first == second
    assert [json.loads(x)["row_index"] for x in first.splitlines()] == [0, 1]


def test_a_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    csv_path = tmp_path / "bom.csv"
    csv_path.write_bytes("\ufeffuser_prompt,ground_truth\nq,a\n".encode())
    assert select_rows(csv_path).rows[0].label == "a"
    jsonl_path = tmp_path / "bom.jsonl"
    jsonl_path.write_bytes('\ufeff{"user_prompt": "q", "label": "b"}\n'.encode())
    assert select_rows(jsonl_path).rows[0].label == "b"
