"""The JSON Schema of the eval config (issue 27 item 16): a valid draft 2020-12 schema, the
same as the file editors are pointed at, accepting every config in examples/ and refusing the
broken configs the config tests use (but for the checks its docstring says it cannot state)."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.upstreams.routing import model_problem
from launcher.config import (
    ALLOWED_SECTIONS,
    EVALUATION_KEYS,
    MAX_N,
    load_eval_config,
    resolve_run_spec,
)
from launcher.config_ray import MAX_MIN_REPLICAS, check_address
from launcher.config_schema import eval_config_schema, schema_text
from launcher.errors import ValidationError
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


# -- The loader's rules, walked against the schema -----------------------------------------------


def _ecma_pattern(
    validator: Any, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    # Editors match patterns as ECMA-262 regexes, where "$" is the end of the string; Python's
    # re also lets it match before a final newline, which would hide "FOO\n" from the check.
    if validator.is_type(instance, "string") and not re.search(
        pattern.replace("$", r"\Z"), instance
    ):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


EDITOR = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})(
    eval_config_schema()
)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    return "[" + ", ".join(_toml_value(item) for item in value) + "]"


def _toml(doc: dict[str, dict[str, Any]]) -> str:
    return "".join(
        f"[{section}]\n"
        + "".join(f"{json.dumps(key)} = {_toml_value(value)}\n" for key, value in table.items())
        for section, table in doc.items()
    )


def _loader_takes(tmp_path: Path, doc: dict[str, dict[str, Any]]) -> bool:
    path = tmp_path / "c.toml"
    text = _toml(doc)
    path.write_text(text)
    assert tomllib.loads(text) == doc  # the file says what the schema is shown
    try:
        resolve_run_spec(load_eval_config(path))
    except ValidationError:
        return False
    return True


_LONG = "x" * 300
#: (section, key, values): every key the loader checks, each with values it takes and values
#: it refuses, near every edge of its rule.
SAMPLES: list[tuple[str, str, list[Any]]] = [
    ("experiment", "rollout", ["echo", "", 1, True]),
    ("experiment", "entrypoint", ["main.py", 2.5, ["a"]]),
    ("experiment", "dataset", ["tiny", 0]),
    (
        "experiment",
        "model_path",
        [
            "openai/gpt-4o-mini",
            "openrouter/vendor/model",
            "gpt-4o",
            "rollbridge/echo",
            " x ",
            "",
            " ",
            "\t\n",
            "openai/",
            "/gpt",
            "/",
            "openai//x",
            "a/b/",
            "rollbridge/",
            "rollbridge/nope",
            "rollbridge/echo2",
            "rollbridge/echo/",
            "rollbridge/echo\n",
            "rollbridgex/echo",
            "a/\n",
            3,
        ],
    ),
    ("experiment", "branch", ["main", "feature/x", "", "a b", "a\n", "\tmain", 1]),
    (
        "experiment",
        "commit_sha",
        ["abcDEF1", "0" * 40, "abc12", "0" * 41, "abcdefg", "abcdef1\n", 1234567],
    ),
    ("evaluation", "n", [1, MAX_N, 0, -1, MAX_N + 1, "1", True, 1.5]),
    ("evaluation", "batch_size", [4, 0, -2, "8", 2.5, True]),
    ("evaluation", "limit", [5, 0, -1, 2.5, "3", False]),
    ("evaluation", "pass_threshold", [0, 1.0, -3.5, 1e308, "1", True, math.inf, -math.inf]),
    *(
        (
            "evaluation",
            key,
            [60, 0.5, 5e-324, 1e308, 0, 0.0, -0.0, -1, -0.5, "5", True, math.inf, -math.inf],
        )
        for key in ("agent_workflow_timeout_s", "grader_timeout_s")
    ),
    ("evaluation", "keep_logprobs", [True, False, 1, "yes"]),
    ("evaluation", "bogus", [1]),
    ("experiment", "bogus", ["x"]),
    ("bridge", "hosted_tools", [[], ["web_search"], [""], "web_search", [1]]),
    *(
        ("bridge", key, ["auto", "native", "translate", "on", "", 1])
        for key in ("responses", "messages")
    ),
    ("bridge", "upstream_http2", ["auto", "on", "off", "yes", True, ""]),
    ("bridge", "bogus", [1]),
    (
        "ray",
        "address",
        [
            "local",
            "auto",
            " local ",
            "10.0.0.1:6379",
            "head.example-1.org:1",
            "[::1]:6379",
            "h:65535",
            "h:080",
            "h:0",
            "h:65536",
            "h:",
            "h",
            ":80",
            "ray://h:10001",
            "a b:80",
            "-h:80",
            "h-:80",
            "a\n:80",
            "::1:80",
            "h:８０",
            "LOCAL",
            "",
            6379,
        ],
    ),
    ("ray", "min_replicas", [1, MAX_MIN_REPLICAS, 0, MAX_MIN_REPLICAS + 1, True, "2", 1.5]),
    (
        "ray",
        "resource",
        [
            "rollbridge_host",
            "_a.b-c",
            "CPU",
            "GPU",
            "memory",
            "object_store_memory",
            "cpu",
            "1x",
            "a b",
            "res\n",
            "",
            1,
        ],
    ),
    ("ray", "bogus", [1]),
    (
        "env",
        "",
        # (name, value) pairs
        [
            ("LOG_LEVEL", "info"),
            ("_X", "1"),
            ("bad_name", "x"),
            ("_OSMOSIS_X", "x"),
            ("FOO\n", "1"),
            ("1X", "1"),
            ("NUM", 3),
        ],
    ),
    (
        "secrets",
        "required",
        [[], ["A"], ["OPENAI_API_KEY"], ["_A"], ["A", "A"], [1], "A", ["A\n"], ["a"]],
    ),
]


def _cases() -> list[Any]:
    cases = []
    for section, key, values in SAMPLES:
        for value in values:
            doc = tomllib.loads(BASE + SECRETS)
            if section == "env":
                name, setting = value
                doc["env"] = {name: setting}
                case_id = f"env.{name!r}={setting!r}"
            else:
                doc.setdefault(section, {})[key] = value
                case_id = f"{section}.{key}={value!r}"
            cases.append(pytest.param(doc, id=case_id))
    return cases


@pytest.mark.parametrize("doc", _cases())
def test_the_schema_takes_what_the_loader_takes_and_refuses_what_it_refuses(
    tmp_path: Path, doc: dict[str, dict[str, Any]]
) -> None:
    assert EDITOR.is_valid(doc) == _loader_takes(tmp_path, doc)


def test_the_walk_meets_both_verdicts_for_every_key(tmp_path: Path) -> None:
    # A key whose samples were all taken (or all refused) would test nothing of its rule.
    for section, key, values in SAMPLES:
        if key == "bogus":
            continue
        verdicts = set()
        for value in values:
            doc = tomllib.loads(BASE + SECRETS)
            if section == "env":
                doc["env"] = dict([value])
            else:
                doc.setdefault(section, {})[key] = value
            verdicts.add(_loader_takes(tmp_path, doc))
        assert verdicts == {True, False}, (section, key)


_MODEL_SCHEMA = EDITOR.evolve(
    schema=eval_config_schema()["properties"]["experiment"]["properties"]["model_path"]
)
_ADDRESS_SCHEMA = EDITOR.evolve(
    schema=eval_config_schema()["properties"]["ray"]["properties"]["address"]
)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="rolbidge/cho ax\n\t", max_size=20))
def test_model_path_pattern_is_the_loaders_rule(name: str) -> None:
    assert _MODEL_SCHEMA.is_valid(name) == (model_problem(name) is None)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="lcautoh.-[]:0169 \n", max_size=16))
def test_ray_address_pattern_is_the_loaders_rule(address: str) -> None:
    try:
        check_address(address, "ray.address")
    except ValidationError:
        taken = False
    else:
        taken = True
    assert _ADDRESS_SCHEMA.is_valid(address) == taken
