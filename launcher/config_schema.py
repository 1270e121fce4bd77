"""A JSON Schema (draft 2020-12) of the eval config, for editors' validation and completion of
``configs/eval/*.toml`` (Taplo / Even Better TOML read ``#:schema`` and schema associations).

Built from the constants :mod:`launcher.config` validates with, so the two cannot drift on
names; docs/schema/eval-config.schema.json is this schema written out (a test keeps it equal).
The schema states what a document can: the sections, keys, types and name patterns. Some
checks of :func:`launcher.config.load_eval_config` and :func:`launcher.config.resolve_run_spec`
are beyond it and stay the CLI's: a name in both ``[env]`` and ``[secrets].required``, a secret
in ``[env]``, a ``model_path`` that names no model, a timeout of 0 or less, NaN (JSON has none),
and an integer written as a float (``n = 1.0``: JSON Schema counts 1.0 as an integer).
"""

from __future__ import annotations

import json
from typing import Any

from bridge.apis import MODES
from launcher.config import EXPERIMENT_OPTIONAL, EXPERIMENT_REQUIRED, MAX_N
from launcher.config_bridge import HTTP2_MODES
from launcher.config_ray import DEFAULT_RESOURCE, MAX_MIN_REPLICAS

__all__ = ["SCHEMA_ID", "eval_config_schema", "schema_text"]

SCHEMA_ID = "https://rollbridge.dev/schema/eval-config.schema.json"
#: Finite floats only (TOML has ``inf``; a bound rejects it).
_FINITE = {"type": "number", "minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308}

_EXPERIMENT_DOCS = {
    "rollout": "The rollout's directory under rollouts/.",
    "entrypoint": "The rollout server's script, inside rollouts/<rollout>/ (e.g. main.py).",
    "model_path": "provider/model (openai/gpt-4o-mini, anthropic/...), or rollbridge/echo.",
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
    "batch_size": {"type": "integer", "description": "Default concurrency (rollouts in flight)."},
    "pass_threshold": {**_FINITE, "description": "A run passes when reward >= threshold."},
    "agent_workflow_timeout_s": {**_FINITE, "description": "Seconds for the agent workflow."},
    "grader_timeout_s": {**_FINITE, "description": "Seconds for the grader."},
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
    experiment["branch"] |= {"minLength": 1, "pattern": r"^\S+$"}
    experiment["commit_sha"] |= {"pattern": "^[0-9a-fA-F]{7,40}$"}
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
            "propertyNames": {"pattern": "^[A-Z_][A-Z0-9_]*$", "not": {"pattern": "^_OSMOSIS_"}},
            "additionalProperties": {"type": "string"},
        },
        "secrets": {
            "type": "object",
            "description": "Secrets the rollout needs (from the environment or --secrets-file).",
            "properties": {
                "required": {
                    "type": "array",
                    "items": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"},
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
                    "pattern": r"^(local|auto|\S+:[0-9]{1,5})$",
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
                    "pattern": "^[A-Za-z_][A-Za-z0-9_.-]*$",
                    "description": f"Custom resource of the replica nodes ({DEFAULT_RESOURCE}).",
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
