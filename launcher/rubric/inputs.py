"""What ``eval rubric`` judges: the rubric text and the records of a JSONL conversations file.

The rules and messages follow the reference tool (spec Part D.1, D.2) so that files and scripts
written for it behave the same here. Everything is checked before any judge is called.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import NotFoundError, ValidationError

__all__ = ["JudgeRecord", "assistant_text", "load_records", "load_rubric", "output_file"]

#: File name used when ``-o`` names a directory.
DEFAULT_REPORT_NAME = "rubric_eval_result.json"


@dataclass(frozen=True)
class JudgeRecord:
    """One thing to score: the candidate text and the context the judge sees with it."""

    index: int
    """1-based position among the records."""
    label: str
    candidate: str
    original_input: str | None = None
    ground_truth: str | None = None
    metadata: dict[str, Any] | None = None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValidationError(f"Cannot read '{path}': {exc.strerror or exc}.") from None


def _not_utf8(path: Path, data: bytes, bad: int) -> ValidationError:
    """The error for the undecodable byte at offset ``bad`` of ``data``, naming its line."""
    lineno = len((data[:bad] + b".").splitlines())  # the lines split as the parse splits them
    return ValidationError(
        f"'{path}' is not UTF-8 text: invalid byte 0x{data[bad]:02x} on line {lineno} "
        f"(byte offset {bad})."
    )


def _decoded(data: bytes, path: Path) -> str:
    """``data`` as UTF-8 text, else a one-line error naming the line and byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, data, exc.start) from None


def load_rubric(value: str) -> str:
    """The rubric: ``value`` itself, or the contents of the file ``@<path>``; stripped."""
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        if not path.exists():
            raise NotFoundError(f"Rubric file '{path}' does not exist.")
        if path.is_dir():
            raise ValidationError(f"Expected a file but received directory '{path}'.")
        text = _decoded(_read_bytes(path), path).strip()
        if not text:
            raise ValidationError(f"Rubric file '{path}' is empty.")
        return text
    text = value.strip()
    if not text:
        raise ValidationError("Rubric text must not be empty.")
    return text


def _part_texts(content: list[Any]) -> str:
    texts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
            if isinstance(text, str) and text.strip():
                texts.append(text.strip())
    return "\n".join(texts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return _part_texts(content)
    return ""


def assistant_text(messages: list[Any]) -> str | None:
    """The content of the last assistant message whose content is not empty, if any."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            text = _content_text(message.get("content"))
            if text:
                return text
    return None


def _label(obj: dict[str, Any], index: int) -> str:
    for key in ("id", "conversation_id"):
        value = obj.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return f"record[{index}]"


def _record(obj: dict[str, Any], index: int, lineno: int, shown: str) -> JudgeRecord:
    messages = obj.get("messages")
    candidate: str | None = None
    if isinstance(messages, list) and messages:
        candidate = assistant_text(messages)
        if candidate is None:
            raise ValidationError(
                f"Line {lineno} of '{shown}': 'messages' list must contain at least one "
                "assistant message with non-empty content."
            )
    else:
        solution = obj.get("solution_str")
        if isinstance(solution, str) and solution.strip():
            candidate = solution.strip()
    if candidate is None:
        raise ValidationError(
            f"Line {lineno} of '{shown}' must include 'messages' (list) or 'solution_str' (string)."
        )
    ground_truth = obj.get("ground_truth")
    original_input = obj.get("original_input")
    metadata = obj.get("metadata")
    return JudgeRecord(
        index=index,
        label=_label(obj, index),
        candidate=candidate,
        original_input=original_input if isinstance(original_input, str) else None,
        ground_truth=ground_truth if isinstance(ground_truth, str) else None,
        metadata=metadata if isinstance(metadata, dict) else None,
    )


def load_records(data: str) -> list[JudgeRecord]:
    """Every record of the JSONL file ``data`` (blank lines skipped), or the first problem."""
    path = Path(data).expanduser()
    shown = str(path)
    if not path.exists():
        raise NotFoundError(f"Data path '{shown}' does not exist.")
    if path.is_dir():
        raise ValidationError(f"Expected a file but received directory '{shown}'.")
    records: list[JudgeRecord] = []
    raw = _read_bytes(path)
    _decoded(raw, path)  # every byte checked before any line is parsed
    # Bytes split on \n, \r and \r\n only (str.splitlines would also split a JSON string at a
    # raw U+2028).
    for lineno, encoded in enumerate(raw.splitlines(), start=1):
        line = encoded.decode("utf-8")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValidationError(f"Invalid JSON on line {lineno} of '{shown}': {exc}") from None
        if not isinstance(obj, dict):
            raise ValidationError(f"Expected JSON object on line {lineno} of '{shown}'.")
        records.append(_record(obj, len(records) + 1, lineno, shown))
    if not records:
        raise ValidationError(f"No JSON records found in '{shown}'.")
    return records


def output_file(value: str) -> Path:
    """Where ``-o <value>`` writes the report: inside it when it is (or looks like) a directory."""
    path = Path(value).expanduser()
    separators = tuple(sep for sep in (os.sep, os.altsep) if sep)
    if value.endswith(separators) or path.is_dir():
        return path / DEFAULT_REPORT_NAME
    return path
