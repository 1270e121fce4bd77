"""Typos and hostile inputs end in one validation message, never in an internal error or all
the memory (issue 12, items 7 and 8)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from launcher.config import MAX_N, EvalConfig, ExperimentConfig, load_eval_config, resolve_run_spec
from launcher.dataset import parse_rows_selector, select_rows
from launcher.errors import CLIError
from launcher.workspace import resolve_output_root, resolve_workspace

from .test_config import BASE, SECRETS
from .test_workspace import make_ws


def _rows(tmp_path: Path, count: int = 3) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"user_prompt":"q{i}","ground_truth":"a"}}\n' for i in range(count)))
    return data


def test_a_huge_rows_range_is_refused_against_the_dataset_size_without_allocating(
    tmp_path: Path,
) -> None:
    data = _rows(tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(CLIError) as err:
            select_rows(data, rows="0-200000000")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.code == "VALIDATION"
    assert str(err.value) == (
        "--rows selects 3-200000000 but d.jsonl has 3 rows (valid indices are 0-2)"
    )
    assert peak < 10 * 1024 * 1024


def test_rows_ranges_are_merged_and_still_select_rows(tmp_path: Path) -> None:
    assert parse_rows_selector(" 5-5,1,1,0-2,3 ") == [(0, 3), (5, 5)]
    sel = select_rows(_rows(tmp_path, 8), rows="6,0-1,1-2")
    assert [r.source_row_index for r in sel.rows] == [0, 1, 2, 6]


def _config(n: object) -> EvalConfig:
    return EvalConfig(
        path=Path("x.toml"),
        experiment=ExperimentConfig("r", "main.py", "m/x", "d"),
        evaluation={"n": n},
    )


def test_n_is_bounded_with_a_message() -> None:
    assert resolve_run_spec(_config(MAX_N)).n == MAX_N
    with pytest.raises(CLIError) as err:
        resolve_run_spec(_config(100_000_000))
    assert str(err.value) == (
        f"evaluation.n is 100000000, above the maximum of {MAX_N} runs per row; lower it (a typo?)"
    )


def test_deeply_nested_toml_is_a_validation_error(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(BASE + SECRETS + "\n[advanced]\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(CLIError) as err:
        load_eval_config(path)
    assert err.value.code == "VALIDATION"
    assert str(err.value) == f"Invalid TOML in {path}: arrays or tables nested too deeply to read"


@pytest.mark.parametrize("column", ["m", "metadata"])
def test_a_deeply_nested_jsonl_line_is_a_validation_error(tmp_path: Path, column: str) -> None:
    data = tmp_path / "d.jsonl"
    nested = "[" * 100_000 + "]" * 100_000
    data.write_text(f'{{"user_prompt":"q","ground_truth":"a"}}\n{{"{column}":{nested}}}\n')
    with pytest.raises(CLIError) as err:
        select_rows(data)
    assert str(err.value) == f"{data}:2: JSON nested too deeply to read; flatten the value"


def test_deeply_nested_csv_metadata_is_a_validation_error(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    data.write_text('user_prompt,metadata\nq,"' + "[" * 100_000 + '"\n')
    with pytest.raises(CLIError) as err:
        select_rows(data)
    assert str(err.value) == "row 0: metadata JSON nested too deeply to read; flatten the value"


def test_a_csv_field_over_16_mib_is_a_validation_error(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    data.write_text('user_prompt,ground_truth\nq,a\n"' + "x" * (16 * 1024 * 1024 + 1) + '",a\n')
    with pytest.raises(CLIError) as err:
        select_rows(data)
    assert err.value.code == "VALIDATION"
    assert str(err.value) == (
        f"{data}: unreadable CSV after line 2: field larger than field limit (16777216)"
    )


def test_output_naming_a_regular_file_is_a_validation_error(tmp_path: Path) -> None:
    ws = resolve_workspace(make_ws(tmp_path / "ws"), tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CLIError) as err:
        resolve_output_root(ws, "file", tmp_path)
    assert str(err.value) == "-o file is a file, not a directory; choose a directory"
    with pytest.raises(CLIError) as err:
        resolve_output_root(ws, "file/sub", tmp_path)
    assert str(err.value) == (
        f"-o file/sub is under {tmp_path / 'file'}, which is a file, not a directory; "
        "choose a directory"
    )
    assert resolve_output_root(ws, "new/dir", tmp_path) == tmp_path / "new" / "dir"
