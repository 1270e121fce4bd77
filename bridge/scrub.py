"""Scrubbing secrets out of text that leaves the bridge (bridge.md §12)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from bridge.errors import MAX_ERROR_MESSAGE

_SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_MIN_ENV_SECRET = 8
_MASK = "[REDACTED]"
_PATTERN_MASK = "REDACTED"

# Shapes of credentials worth scrubbing even when we do not know their value: provider keys,
# authorization headers, credentials in URL query strings or URL userinfo, key/value dumps.
_PATTERNS = re.compile(
    "|".join(
        [
            r"\bsk-[A-Za-z0-9_\-]{16,}",
            r"\bBearer\s+[A-Za-z0-9\-._~+/]{8,}=*",
            r"\bBasic\s+[A-Za-z0-9+/]{8,}={0,2}",
            r"(?<=[?&])(?:key|api[_-]?key|access_token|token|sig|signature|password|secret)=[^\s&'\"]+",
            r"(?i:\b(?:x-)?api[_-]?key)['\"]?\s*[:=]\s*['\"]?[^\s,'\"})\]{}>]{4,}",
            r"\bAIza[0-9A-Za-z_\-]{30,}",
            r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
            r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*",
            r"(?<=://)[^\s/'\":@]{1,256}:[^\s/'\"@]{1,256}(?=@)",
        ]
    )
)
_WHITESPACE = re.compile(r"\s+")


def env_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables whose name says they hold a secret."""
    env = os.environ if environ is None else environ
    return [
        value
        for name, value in env.items()
        if len(value) >= _MIN_ENV_SECRET and any(part in name for part in _SECRET_NAME_PARTS)
    ]


class Redactor:
    """Removes known secret values and credential-shaped text from a message.

    Known values (the run's bearer token, provider keys, anything in a secret-named
    environment variable at the time of the call) become ``[REDACTED]``; credential-shaped
    text becomes ``REDACTED``. ``extra`` is an outside redactor (the run's) applied last.
    """

    def __init__(
        self, secrets: Iterable[str] = (), extra: Callable[[str], str] | None = None
    ) -> None:
        self._secrets = [s for s in secrets if s]
        self._extra = extra

    def scrub(self, text: str) -> str:
        """Redact ``text`` without reshaping it (for log lines)."""
        values = {*self._secrets, *env_secrets()}
        for value in sorted(values, key=len, reverse=True):
            text = text.replace(value, _MASK)
        text = _PATTERNS.sub(_PATTERN_MASK, text)
        if self._extra is not None:
            text = self._extra(text)
        return text

    def __call__(self, text: str) -> str:
        """Redact, collapse whitespace and truncate: the message a rollout is sent."""
        text = _WHITESPACE.sub(" ", self.scrub(text)).strip()
        return text[:MAX_ERROR_MESSAGE]
