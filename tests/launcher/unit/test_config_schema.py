"""The JSON Schema of the eval config (issue 27 item 16): a valid draft 2020-12 schema, the
same as the file editors are pointed at, accepting every config in examples/ and refusing the
broken configs the config tests use (but for the checks its docstring says it cannot state)."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from launcher.config import ALLOWED_SECTIONS, EVALUATION_KEYS, load_eval_config
from launcher.config_schema import eval_config_schema, schema_text
from tests.launcher.unit.test_config import BASE, IMMEDIATE_ERRORS, RUN_SPEC_ERRORS, SECRETS

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(ROOT.glob("examples/**/configs/eval/*.toml"))
VALIDATOR = jsonschema.Draft202012Validator(eval_config_schema())

#: Refused by the CLI for reasons a JSON Schema cannot state (see launcher/config_schema.py).
BEYOND_A_SCHEMA = ("appear in both [env] and [secrets]", "must be an integer, got 1.0", "got nan")


def _within(cases: list[Any]) -> list[Any]:
    return [case for case in cases if not any(reason in case[1] for reason in BEYOND_A_SCHEMA)]


def _errors(doc: dict[str, Any]) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(doc)]


def test_the_schema_is_valid_and_the_file_is_current() -> None:
    jsonschema.Draft202012Validator.check_schema(eval_config_schema())
    assert (ROOT / "docs" / "schema" / "eval-config.schema.json").read_text() == schema_text()
    schema = eval_config_schema()
    assert set(schema["properties"]) == set(ALLOWED_SECTIONS)
    assert set(schema["properties"]["evaluation"]["properties"]) == set(EVALUATION_KEYS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_config_is_valid(path: Path) -> None:
    load_eval_config(path)  # the CLI's own check, so the examples really are valid
    assert _errors(tomllib.loads(path.read_text())) == []


def test_there_are_examples_and_few_exceptions() -> None:
    assert len(EXAMPLES) >= 5
    assert len(IMMEDIATE_ERRORS) - len(_within(IMMEDIATE_ERRORS)) == 1
    assert len(RUN_SPEC_ERRORS) - len(_within(RUN_SPEC_ERRORS)) == 2


@pytest.mark.parametrize(("text", "message"), _within(IMMEDIATE_ERRORS))
def test_the_config_tests_broken_configs_are_refused(text: str, message: str) -> None:
    assert _errors(tomllib.loads(text)) != []


@pytest.mark.parametrize(("evaluation", "message"), _within(RUN_SPEC_ERRORS))
def test_the_config_tests_broken_evaluation_values_are_refused(
    evaluation: dict[str, Any], message: str
) -> None:
    doc = tomllib.loads(BASE + SECRETS)
    doc["evaluation"] = evaluation
    assert _errors(doc) != []


def test_collected_issues_are_refused_too() -> None:
    text = (
        "[extra]\na=1\n"
        + BASE.replace('dataset = "tiny"', "dataset = 123")
        + 'branch = "has space"\ncommit_sha = "xyz"\nunknown = 1\n'
        + "[evaluation]\nbogus = 1\n"
        + "[env]\nNUM = 3\n"
        + SECRETS
    )
    assert len(_errors(tomllib.loads(text))) >= 6


def test_infinity_and_a_huge_n_are_refused() -> None:
    doc = tomllib.loads(BASE + SECRETS)
    doc["evaluation"] = {"pass_threshold": math.inf}
    assert _errors(doc) != []
    doc["evaluation"] = {"n": 10_001}
    assert _errors(doc) != []
