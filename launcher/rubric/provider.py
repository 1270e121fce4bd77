"""Which provider a judge model names, the key it needs, its default timeout and the request
parameters of a judge call (spec Part D.4). Pure functions: nothing here does I/O."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "JudgeModel",
    "ParsedVerdict",
    "VerdictError",
    "judge_model",
    "parse_verdict",
    "request_params",
]

_OPENAI_FAMILY = ("gpt-", "o1-", "o3-", "o4-")
_KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "xai": "XAI_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "google": "GEMINI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "cerebras": "CEREBRAS_API_KEY",
    "azure": "AZURE_API_KEY",
    "bedrock": "AWS_ACCESS_KEY_ID",
    "vertex_ai": "GOOGLE_APPLICATION_CREDENTIALS",
}
_TIMEOUTS = {"xai": 45.0, "gemini": 45.0, "cerebras": 60.0, "openrouter": 60.0}
_DEFAULT_TIMEOUT = 30.0
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)

_SCHEMA: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "rubric_response",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"score": {"type": "number"}, "explanation": {"type": "string"}},
            "required": ["score", "explanation"],
            "additionalProperties": False,
        },
    },
}


@dataclass(frozen=True)
class JudgeModel:
    """A judge model as the user wrote it, and what it resolves to."""

    given: str
    provider: str | None
    """Lower-cased provider, None when it cannot be told from the name."""
    route: str
    """The model string handed to the bridge's upstream paths (LiteLLM format)."""
    bare: str
    """The name without its provider prefix, as error messages show it."""

    @property
    def key_variable(self) -> str | None:
        """The environment variable holding this provider's key, for the providers that have
        a well-known one; None otherwise (the upstream path resolves credentials itself)."""
        return _KEY_VARIABLES.get(self.provider or "")

    def default_timeout(self) -> float:
        """Seconds per request when ``--timeout`` is not given."""
        if self.provider == "xai" and self.bare.startswith("grok-4"):
            return 60.0
        return _TIMEOUTS.get(self.provider or "", _DEFAULT_TIMEOUT)

    def missing_key(self, environ: Mapping[str, str]) -> str | None:
        """The reference's message when this provider's key variable is not set."""
        variable = self.key_variable
        if variable is None or environ.get(variable):
            return None
        return (
            f"Environment variable '{variable}' is not set. Export it with your "
            f"{self.provider} API key before calling evaluate_rubric."
        )


def judge_model(model: str) -> JudgeModel:
    """Resolve ``model`` (``provider/name`` or a bare, well-known name)."""
    model = model.strip()
    if "/" in model:
        provider, bare = model.split("/", 1)
        return JudgeModel(model, provider.lower(), model, bare)
    lowered = model.lower()
    if lowered.startswith(_OPENAI_FAMILY):
        return JudgeModel(model, "openai", f"openai/{model}", model)
    for prefix, provider in (("claude", "anthropic"), ("gemini", "gemini"), ("grok", "xai")):
        if lowered.startswith(prefix):
            return JudgeModel(model, provider, model, model)
    return JudgeModel(model, None, model, model)


def request_params(judge: JudgeModel) -> dict[str, Any]:
    """``temperature=0`` and the response format.

    The reference asks LiteLLM whether the model supports a strict JSON schema; importing
    LiteLLM costs seconds (docs/hazards.md #2), so the schema is sent to OpenAI models, which
    support it, and every other judge is asked for a plain JSON object.
    """
    response_format = _SCHEMA if judge.provider == "openai" else {"type": "json_object"}
    return {"temperature": 0, "response_format": response_format}


class VerdictError(ValueError):
    """The judge answered, but not with a usable verdict."""


@dataclass(frozen=True)
class ParsedVerdict:
    """A judge's verdict, the score clamped to the range."""

    score: float
    explanation: str


def _strip_fence(text: str) -> str:
    for opening in ("```json", "```"):
        if text.startswith(opening):
            text = text[len(opening) :]
            break
    text = text.strip()
    if text.endswith("```"):
        text = text[:-3]
    return text.strip()


def parse_verdict(content: Any, score_min: float, score_max: float) -> ParsedVerdict:
    """Read ``{"score": <number>, "explanation": "<text>"}`` out of a judge's reply."""
    if not isinstance(content, str) or not content.strip():
        raise VerdictError("Model response did not include any content.")
    text = _strip_fence(_THINK.sub("", content.strip()).strip())
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise VerdictError(f"Model response was not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise VerdictError("Model response must be a JSON object.")
    score = obj.get("score")
    try:
        value = (
            float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None
        )
    except OverflowError:  # an integer too large for a float
        value = None
    if value is None or not math.isfinite(value):
        raise VerdictError("Model response must include a finite numeric 'score'.")
    explanation = obj.get("explanation")
    if not isinstance(explanation, str) or not explanation.strip():
        raise VerdictError("Model response must include a non-empty string 'explanation'.")
    clamped = min(max(value, score_min), score_max)
    return ParsedVerdict(clamped, explanation.strip())
