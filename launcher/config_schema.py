"""A JSON Schema (draft 2020-12) of the eval config, for editors' validation and completion of
``configs/eval/*.toml`` (Taplo / Even Better TOML read ``#:schema`` and schema associations).

Built from the constants :mod:`launcher.config` validates with, so the two cannot drift on
names; docs/schema/eval-config.schema.json is this schema written out (a test keeps it equal).
The schema states every check :func:`launcher.config.load_eval_config` and
:func:`launcher.config.resolve_run_spec` make of one value: the sections, keys, types, names,
``model_path`` (:func:`bridge.upstreams.routing.model_problem`: not empty, a model after the
provider, no empty part, no ``rollbridge/`` name but the offline model), timeouts above 0,
``[ray]`` addresses and resources (tests/launcher/unit/test_config_schema.py walks them against
the loader). Its patterns use no lookaround, which some editors' regex engines lack, and read
``$`` as the end of the string (ECMA-262). Beyond it, and left to the CLI: a name in both
``[env]`` and ``[secrets].required``, a secret in ``[env]`` (a rule on name and value
together), NaN (JSON has none), and an integer written as a float (``n = 1.0``: JSON Schema
counts 1.0 as an integer). ``batch_size`` of 0 or less is valid in both: it is ignored with a
warning, as the reference reads it.
"""

from __future__ import annotations

import json
from typing import Any

from bridge.apis import MODES
from bridge.upstreams.routing import OFFLINE_MODEL
from launcher.config import (
    COMMIT_SHA_PATTERN,
    ENV_NAME_PATTERN,
    EXPERIMENT_OPTIONAL,
    EXPERIMENT_REQUIRED,
    MAX_N,
    SECRET_NAME_PATTERN,
)
from launcher.config_bridge import HTTP2_MODES
from launcher.config_ray import (
    BUILTIN_RESOURCES,
    DEFAULT_RESOURCE,
    HOST_PATTERN,
    MAX_MIN_REPLICAS,
    RESOURCE_PATTERN,
)

__all__ = ["SCHEMA_ID", "eval_config_schema", "schema_text"]

SCHEMA_ID = "https://rollbridge.dev/schema/eval-config.schema.json"
_MAX_FLOAT = 1.7976931348623157e308
#: Finite floats only (TOML has ``inf``; a bound rejects it).
_FINITE = {"type": "number", "minimum": -_MAX_FLOAT, "maximum": _MAX_FLOAT}
#: A timeout: seconds above 0 (``launcher.config._timeout``; leave it out for none).
_SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": _MAX_FLOAT}
#: ``model_path`` as :func:`bridge.upstreams.routing.model_problem` takes it: something other
#: than white space, and none of the shapes it refuses (``anyOf`` of plain patterns rather than
#: one pattern of lookaheads).
_MODEL_PATH = {
    "pattern": r"\S",
    "not": {
        "anyOf": [
            {"pattern": "^/"},
            {"pattern": "/$"},
            {"pattern": "//"},
            {"pattern": "^rollbridge/", "not": {"const": OFFLINE_MODEL}},
        ]
    },
}
#: 1 to 65535, leading zeros allowed (``launcher.config_ray.split_address`` reads it with int()).
_PORT = r"0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
#: ``local``, ``auto`` or HOST:PORT, with white space around (the loader strips it).
_ADDRESS = rf"^\s*(local|auto|{HOST_PATTERN[1:-1]}:{_PORT})\s*$"

_EXPERIMENT_DOCS = {
    "rollout": "The rollout's directory under rollouts/.",
    "entrypoint": "The rollout server's script, inside rollouts/<rollout>/ (e.g. main.py).",
    "model_path": f"provider/model (openai/gpt-4o-mini, anthropic/...), or {OFFLINE_MODEL}.",
    "dataset": "A file in data/ (.jsonl, .csv or .parquet; the extension may be omitted).",
    "branch": "The git branch of the rollout (exclusive with commit_sha).",
    "commit_sha": "The git commit of the rollout, 7 to 40 hex digits (exclusive with branch).",
}
_EVALUATION: dict[str, dict[str, Any]] = {
    "limit": {"type": "integer", "description": "The first N rows (absent: every row)."},
    "n": {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_N,
        "description": "Runs per row (pass@k is reported when n >= 2).",
    },
    "batch_size": {
        "type": "integer",
        "description": "Default concurrency (rollouts in flight); 0 or less is ignored.",
    },
    "pass_threshold": {**_FINITE, "description": "A run passes when reward >= threshold."},
    "agent_workflow_timeout_s": {
        **_SECONDS,
        "description": "Seconds for the agent workflow, above 0 (absent: no timeout).",
    },
    "grader_timeout_s": {
        **_SECONDS,
        "description": "Seconds for the grader, above 0 (absent: no timeout).",
    },
    "keep_logprobs": {
        "type": "boolean",
        "description": "Keep logprobs and token ids in calls.jsonl when the provider returns them.",
    },
}


def eval_config_schema() -> dict[str, Any]:
    """The schema as a JSON-ready dict."""
    experiment: dict[str, Any] = {
        key: {"type": "string", "description": _EXPERIMENT_DOCS[key]}
        for key in (*EXPERIMENT_REQUIRED, *EXPERIMENT_OPTIONAL)
    }
    experiment["model_path"] |= _MODEL_PATH
    experiment["branch"] |= {"minLength": 1, "pattern": r"^\S+$"}
    experiment["commit_sha"] |= {"pattern": COMMIT_SHA_PATTERN}
    sections: dict[str, Any] = {
        "experiment": {
            "type": "object",
            "description": "What to evaluate.",
            "properties": experiment,
            "required": list(EXPERIMENT_REQUIRED),
            "additionalProperties": False,
            "not": {"required": ["branch", "commit_sha"]},
        },
        "evaluation": {
            "type": "object",
            "description": "How to evaluate (all optional).",
            "properties": _EVALUATION,
            "additionalProperties": False,
        },
        "advanced": {
            "type": "object",
            "description": "Recorded in the manifest, not consumed by rollbridge eval run.",
        },
        "env": {
            "type": "object",
            "description": "Variables exported to the rollout server.",
            "propertyNames": {"pattern": ENV_NAME_PATTERN, "not": {"pattern": "^_OSMOSIS_"}},
            "additionalProperties": {"type": "string"},
        },
        "secrets": {
            "type": "object",
            "description": "Secrets the rollout needs (from the environment or --secrets-file).",
            "properties": {
                "required": {
                    "type": "array",
                    "items": {"type": "string", "pattern": SECRET_NAME_PATTERN},
                    "uniqueItems": True,
                    "description": 'Names, e.g. ["OPENAI_API_KEY"]; [] when none.',
                }
            },
            "required": ["required"],
            "additionalProperties": False,
        },
        "bridge": {
            "type": "object",
            "description": (
                "What the Responses and Messages routes may do, and how the bridge calls the "
                "provider (docs/bridge.md)."
            ),
            "properties": {
                "hosted_tools": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "description": "Provider-run tool types granted (none by default).",
                },
                **{
                    api: {
                        "enum": list(MODES),
                        "description": f"{label}: native pass-through or translation.",
                    }
                    for api, label in (
                        ("responses", "openai/… models"),
                        ("messages", "anthropic/… models"),
                    )
                },
                "upstream_http2": {
                    "enum": list(HTTP2_MODES),
                    "default": "auto",
                    "description": (
                        "HTTP/2 to the provider: auto (when the in-flight asked for does not fit "
                        "the open-file limit over HTTP/1.1), on, or off."
                    ),
                },
            },
            "additionalProperties": False,
        },
        "ray": {
            "type": "object",
            "description": "Replicas on a Ray cluster (docs/scale-out.md); flags win, runtime-only.",
            "properties": {
                "address": {
                    "type": "string",
                    "pattern": _ADDRESS,
                    "description": "The cluster's HOST:PORT, 'local' (a one-node cluster of "
                    "the run's own) or 'auto' (this machine's: RAY_ADDRESS, or `ray start`'s).",
                },
                "min_replicas": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_MIN_REPLICAS,
                    "description": "Halt when fewer replicas are healthy (the head's counts).",
                },
                "resource": {
                    "type": "string",
                    "pattern": RESOURCE_PATTERN,
                    "not": {"enum": list(BUILTIN_RESOURCES)},
                    "description": f"Custom resource of the replica nodes ({DEFAULT_RESOURCE}; "
                    "not one of Ray's own).",
                },
            },
            "additionalProperties": False,
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "rollbridge eval config",
        "description": "configs/eval/*.toml of a rollbridge workspace (docs/eval-run.md, Config).",
        "type": "object",
        "properties": sections,
        "required": ["experiment", "secrets"],
        "additionalProperties": False,
    }


def schema_text() -> str:
    """The schema as the file docs/schema/eval-config.schema.json holds it."""
    return json.dumps(eval_config_schema(), indent=2) + "\n"
