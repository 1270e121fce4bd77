"""The eval TOML config (docs/spec/supervisor.md §1): loading, validation with the exact messages, run spec.

:func:`load_eval_config` checks structure and names (§1.1); :func:`resolve_run_spec` checks
and converts the ``[evaluation]`` values (§1.3). Every problem is a
:class:`~launcher.errors.ValidationError` with the message the user sees after ``Error:``.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bridge.apis import ApiOptions
from bridge.upstreams.routing import OFFICIAL_OPENAI_BASE, OFFLINE_MODEL, model_problem
from launcher.config_bridge import bridge_options, upstream_http2
from launcher.config_ray import RayConfig, ray_section
from launcher.config_tables import check_env_entry
from launcher.errors import ValidationError

__all__ = [
    "ALLOWED_SECTIONS",
    "COMMIT_SHA_PATTERN",
    "ENV_NAME_PATTERN",
    "EVALUATION_KEYS",
    "MAX_N",
    "SECRET_NAME_PATTERN",
    "EvalConfig",
    "ExperimentConfig",
    "RunSpec",
    "advanced_keys_warning",
    "ignored_batch_size_warning",
    "load_eval_config",
    "resolve_run_spec",
    "upstream_base_url",
]

ALLOWED_SECTIONS = ("experiment", "evaluation", "advanced", "env", "secrets", "bridge", "ray")
EXPERIMENT_REQUIRED = ("rollout", "entrypoint", "model_path", "dataset")
EXPERIMENT_OPTIONAL = ("branch", "commit_sha")
EVALUATION_KEYS = (
    "limit",
    "n",
    "batch_size",
    "pass_threshold",
    "agent_workflow_timeout_s",
    "grader_timeout_s",
    "keep_logprobs",
)
ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
SECRET_NAME_PATTERN = r"^[A-Z][A-Z0-9_]*$"
COMMIT_SHA_PATTERN = r"^[0-9a-fA-F]{7,40}$"
# Matched whole (fullmatch): with re.match, "$" also matches before a final newline, and a
# name such as "FOO\n" would pass (the JSON Schema's "$" is the end of the string).
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN)
_COMMIT_SHA = re.compile(COMMIT_SHA_PATTERN)
# Extra time on top of the agent + grader timeouts before the supervisor gives up on an item.
_NETWORK_GRACE_S = 60.0
_DEFAULT_ITEM_DEADLINE_S = 3600.0
MAX_N = 10_000
"""The most runs per row ``evaluation.n`` may ask for: far above any pass@k in use, and low
enough that a typo (``n = 100000000``) is refused before anything is allocated for it."""


@dataclass(frozen=True)
class ExperimentConfig:
    """The ``[experiment]`` section."""

    rollout: str
    entrypoint: str
    model_path: str
    dataset: str
    branch: str | None = None
    commit_sha: str | None = None


@dataclass(frozen=True)
class EvalConfig:
    """A loaded, structurally valid eval config.

    ``evaluation`` holds the raw ``[evaluation]`` values (types are checked by
    :func:`resolve_run_spec`); ``advanced`` is passed through to the manifest provenance.
    """

    path: Path
    experiment: ExperimentConfig
    evaluation: dict[str, Any] = field(default_factory=dict)
    advanced: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    secrets_required: tuple[str, ...] = ()
    bridge: ApiOptions | None = None
    """The ``[bridge]`` section (:mod:`launcher.config_bridge`); None when absent."""
    upstream_http2: str = "auto"
    """``[bridge] upstream_http2``: ``off`` | ``on`` | ``auto`` (:mod:`launcher.config_bridge`)."""
    ray: RayConfig | None = None
    """The ``[ray]`` section (:mod:`launcher.config_ray`); None when absent."""


@dataclass(frozen=True)
class RunSpec:
    """Validated ``[evaluation]`` values (§1.3).

    ``batch_size`` is kept as given (values <= 0 are ignored when concurrency is resolved);
    ``limit`` is None when absent; the two timeouts are None when absent.
    """

    n: int = 1
    pass_threshold: float = 1.0
    batch_size: int | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    limit: int | None = None
    keep_logprobs: bool = True
    """Whether ``calls.jsonl`` keeps the logprobs and token ids providers return (ours)."""

    @property
    def item_deadline_s(self) -> float:
        """How long to wait for an admitted item's result (§7.2).

        ``max(agent,0) + max(grader,0) + 60`` when both timeouts are set, otherwise 3600 s.
        """
        if self.agent_timeout_sec is None or self.grader_timeout_sec is None:
            return _DEFAULT_ITEM_DEADLINE_S
        return (
            max(self.agent_timeout_sec, 0.0) + max(self.grader_timeout_sec, 0.0) + _NETWORK_GRACE_S
        )


def advanced_keys_warning(config: EvalConfig, command: str = "rollbridge eval run") -> str | None:
    """The warning printed when ``[advanced]`` has keys (§0 step 7), or None when it is empty."""
    if not config.advanced:
        return None
    keys = ", ".join(sorted(config.advanced))
    return f"[advanced] keys are recorded but not consumed by `{command}`: {keys}"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValidationError(f"Config file not found: {path}") from None
    except IsADirectoryError as exc:
        raise ValidationError(f"Cannot read config file {path}: {exc}") from None
    except OSError as exc:
        raise ValidationError(f"Cannot read config file {path}: {exc}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValidationError(f"Invalid TOML in {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"Invalid TOML in {path}: {exc}") from None
    except RecursionError:
        raise ValidationError(
            f"Invalid TOML in {path}: arrays or tables nested too deeply to read"
        ) from None


def _check_secrets_section(data: dict[str, Any], path: Path) -> list[Any]:
    if "secrets" not in data:
        raise ValidationError(f"Missing [secrets] section in {path}")
    secrets = data["secrets"]
    if not isinstance(secrets, dict):
        raise ValidationError(f"[secrets] must be a table in {path}")
    unknown = sorted(k for k in secrets if k != "required")
    if unknown:
        raise ValidationError(
            f"[secrets] in {path} only supports the 'required' field; "
            f"unknown key(s): {', '.join(unknown)}."
        )
    if "required" not in secrets:
        raise ValidationError(f"Missing 'required' in [secrets] section of {path}")
    required = secrets["required"]
    if not isinstance(required, list) or not all(isinstance(x, str) for x in required):
        raise ValidationError(
            f"'required' in [secrets] of {path} must be a list of strings, "
            'e.g. required = ["OPENAI_API_KEY"].'
        )
    return required


def _experiment_issues(experiment: dict[str, Any]) -> list[tuple[str, str]]:
    issues: list[tuple[str, str]] = []
    for key in experiment:
        if key not in EXPERIMENT_REQUIRED and key not in EXPERIMENT_OPTIONAL:
            issues.append((f"experiment.{key}", "Unrecognized key"))
    for key in EXPERIMENT_REQUIRED:
        value = experiment[key]
        if not isinstance(value, str):
            issues.append((f"experiment.{key}", f"must be a string, got {value!r}"))
    branch = experiment.get("branch")
    if branch is not None:
        if not isinstance(branch, str):
            issues.append(("experiment.branch", f"must be a string, got {branch!r}"))
        elif not branch or any(ch.isspace() for ch in branch):
            issues.append(
                (
                    "experiment.branch",
                    "is invalid: branch must be non-empty and contain no whitespace",
                )
            )
    commit = experiment.get("commit_sha")
    if commit is not None:
        if not isinstance(commit, str):
            issues.append(("experiment.commit_sha", f"must be a string, got {commit!r}"))
        elif not _COMMIT_SHA.fullmatch(commit):
            issues.append(
                (
                    "experiment.commit_sha",
                    "is invalid: commit_sha must be 7 to 40 hexadecimal characters",
                )
            )
    if branch is not None and commit is not None:
        issues.append(
            ("experiment", "is invalid: branch and commit_sha are mutually exclusive; set only one")
        )
    return issues


def load_eval_config(path: Path) -> EvalConfig:
    """Read and validate an eval TOML file (§1.1); raise ValidationError with the exact message."""
    path = Path(path)
    data = _read_toml(path)

    issues: list[tuple[str, str]] = [
        (key, "Unrecognized section") for key in data if key not in ALLOWED_SECTIONS
    ]

    if "experiment" not in data:
        raise ValidationError(f"Missing [experiment] section in {path}")
    experiment = data["experiment"]
    if not isinstance(experiment, dict):
        raise ValidationError(f"[experiment] must be a table in {path}")
    for key in EXPERIMENT_REQUIRED:
        if key not in experiment:
            raise ValidationError(f"Missing '{key}' in [experiment] section of {path}")
    for section in ("evaluation", "advanced", "env"):
        if section in data and not isinstance(data[section], dict):
            raise ValidationError(f"[{section}] must be a table in {path}")
    required = _check_secrets_section(data, path)

    issues.extend(_experiment_issues(experiment))
    evaluation: dict[str, Any] = dict(data.get("evaluation", {}))
    issues.extend(
        (f"evaluation.{key}", "Unrecognized key")
        for key in evaluation
        if key not in EVALUATION_KEYS
    )
    env: dict[str, Any] = dict(data.get("env", {}))
    issues.extend(
        (f"env.{name}", f"must be a string, got {value!r}")
        for name, value in env.items()
        if not isinstance(value, str)
    )
    if issues:
        lines = "\n".join(f"  - {key}: {message}" for key, message in issues)
        raise ValidationError(
            f"Invalid eval config:\n{lines}",
            details={
                "error": "Invalid eval config",
                "issues": [{"key": key, "message": message} for key, message in issues],
            },
        )

    problem = model_problem(experiment["model_path"])
    if problem is not None:
        raise ValidationError(f"Invalid model_path in [experiment] of {path}: {problem}")
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise ValidationError(
                f"Invalid env var name '{name}' in [env] of {path}: must match ^[A-Z_][A-Z0-9_]*$"
            )
        if name.startswith("_OSMOSIS_"):
            raise ValidationError(
                f"Invalid env var name '{name}' in [env] of {path}: env var names starting with "
                "_OSMOSIS_ are reserved by the platform; choose a different name."
            )
        check_env_entry(name, env[name], path)
    duplicates = sorted({name for name in required if required.count(name) > 1})
    if duplicates:
        raise ValidationError(
            f"Duplicate secret name(s) in [secrets].required of {path}: "
            f"{', '.join(duplicates)}. Each name must appear once."
        )
    for name in required:
        if not _SECRET_NAME.fullmatch(name):
            raise ValidationError(
                f"Invalid secret name '{name}' in [secrets].required of {path}: "
                "must match ^[A-Z][A-Z0-9_]*$"
            )
    both = sorted(set(env) & set(required))
    if both:
        raise ValidationError(
            f"Name(s) appear in both [env] and [secrets] of {path}: {', '.join(both)}. "
            "Each env var name must come from exactly one place."
        )

    return EvalConfig(
        path=path,
        experiment=ExperimentConfig(
            rollout=experiment["rollout"],
            entrypoint=experiment["entrypoint"],
            model_path=experiment["model_path"],
            dataset=experiment["dataset"],
            branch=experiment.get("branch"),
            commit_sha=experiment.get("commit_sha"),
        ),
        evaluation=evaluation,
        advanced=dict(data.get("advanced", {})),
        env=dict(env),
        secrets_required=tuple(required),
        bridge=bridge_options(data, path),
        upstream_http2=upstream_http2(data, path),
        ray=ray_section(data, path),
    )


def ignored_batch_size_warning(spec: RunSpec) -> str | None:
    """The warning for a ``batch_size`` of 0 or less (ignored, as the reference reads it)."""
    if spec.batch_size is None or spec.batch_size > 0:
        return None
    return (
        f"evaluation.batch_size = {spec.batch_size} is ignored (0 or less, as osmosis-ai reads "
        "it): concurrency comes from --max-in-flight, else the rollout server's capacity"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"evaluation.{key} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValidationError(f"evaluation.{key} must be finite, got {value!r}")
    return float(value)


def _timeout(ev: dict[str, Any], key: str) -> float | None:
    """A timeout of ``[evaluation]``: absent, or a positive number of seconds. The reference
    takes any sign, and every row then fails at its deadline while the run exits 0."""
    if ev.get(key) is None:
        return None
    seconds = _number(key, ev[key])
    if seconds <= 0:
        raise ValidationError(
            f"evaluation.{key} must be a positive number of seconds, got {ev[key]!r} "
            "(leave it out for no timeout)"
        )
    return seconds


def resolve_run_spec(config: EvalConfig, *, limit_override: int | None = None) -> RunSpec:
    """Check and convert ``[evaluation]`` (§1.3), in the reference's order.

    ``limit_override`` replaces ``evaluation.limit`` (tools and benchmarks; the CLI has no flag
    for it). Keys that are absent get their defaults; ``pass_threshold`` defaults to 1.0 only
    when absent, so an explicit 0.0 stays 0.0.
    """
    ev = config.evaluation
    pass_threshold = 1.0
    if ev.get("pass_threshold") is not None:
        pass_threshold = _number("pass_threshold", ev["pass_threshold"])
    n = 1
    if ev.get("n") is not None:
        if not _is_int(ev["n"]):
            raise ValidationError(f"evaluation.n must be an integer, got {ev['n']!r}")
        if ev["n"] <= 0:
            raise ValidationError(f"evaluation.n must be a positive integer, got {ev['n']}")
        if ev["n"] > MAX_N:
            raise ValidationError(
                f"evaluation.n is {ev['n']}, above the maximum of {MAX_N} runs per row; "
                "lower it (a typo?)"
            )
        n = ev["n"]
    batch_size: int | None = None
    if ev.get("batch_size") is not None:
        if not _is_int(ev["batch_size"]):
            raise ValidationError(
                f"evaluation.batch_size must be an integer, got {ev['batch_size']!r}"
            )
        batch_size = ev["batch_size"]
    agent = _timeout(ev, "agent_workflow_timeout_s")
    grader = _timeout(ev, "grader_timeout_s")
    keep_logprobs = ev.get("keep_logprobs", True)
    if not isinstance(keep_logprobs, bool):
        raise ValidationError(
            f"evaluation.keep_logprobs must be true or false, got {keep_logprobs!r}"
        )
    limit = ev.get("limit") if limit_override is None else limit_override
    if limit is not None and not _is_int(limit):
        raise ValidationError(f"evaluation.limit must be an integer, got {limit!r}")
    return RunSpec(
        n=n,
        pass_threshold=pass_threshold,
        batch_size=batch_size,
        agent_timeout_sec=agent,
        grader_timeout_sec=grader,
        limit=limit,
        keep_logprobs=keep_logprobs,
    )


# Where each direct-path provider's base URL comes from (the variables LiteLLM reads, in its
# order; bridge.upstreams.routing resolves the same ones per call) and its default.
_DIRECT_BASES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "openai": (("OPENAI_BASE_URL", "OPENAI_API_BASE"), OFFICIAL_OPENAI_BASE),
    "openrouter": (("OPENROUTER_API_BASE",), "https://openrouter.ai/api/v1"),
    "hosted_vllm": (("HOSTED_VLLM_API_BASE",), None),
}


def upstream_base_url(model_path: str, environ: Mapping[str, str]) -> str | None:
    """The base URL the bridge will send ``model_path``'s calls to, as far as the environment
    says; None for the offline model and for a provider left at LiteLLM's default.

    Part of the run's model lock, so a resume against another server (another
    ``OPENAI_BASE_URL``) is refused. It never holds a credential: user info, query and
    fragment are removed (a key can hide in any of them).
    """
    if model_path == OFFLINE_MODEL or "/" not in model_path:
        return None
    provider = model_path.split("/", 1)[0]
    names, default = _DIRECT_BASES.get(
        provider, ((f"{provider.upper()}_API_BASE", f"{provider.upper()}_BASE_URL"), None)
    )
    value = next((environ[n] for n in names if environ.get(n)), default)
    if not value:
        return None
    parts = urlsplit(value.strip())
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
