"""Scrubbing secrets out of text that leaves the bridge (docs/spec/bridge.md §12)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from bridge.errors import MAX_ERROR_MESSAGE
from rollout_server.net.secrets import (
    AMBIENT_MIN_LENGTH,
    REDACTED,
    SecretMatcher,
    secret_env_values,
)

_PATTERN_MASK = "REDACTED"

# Shapes of credentials worth scrubbing even when we do not know their value: provider keys,
# authorization headers, credentials in URL query strings or URL userinfo, key/value dumps.
# A key's prefix in any case, as known values are matched (rollout_server.net.secrets): output
# that was upper-cased holds SK-… and RBK-…; "Basic" and "Bearer" stay as written, as ordinary
# words in another case ("basic settings") would be masked.
_PATTERNS = re.compile(
    "|".join(
        [
            r"(?i:\bsk-)[A-Za-z0-9_\-]{16,}",
            r"(?i:\brbk-)[A-Za-z0-9_\-]{43}",  # a rollout's own bridge bearer (bridge.bearers)
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


class ErrorScrubber:
    """Removes known secret values and credential-shaped text from error messages and log lines.

    Known values (``secrets``: the run's bearer token, the provider key) and the secret values
    of the environment as it is when the scrubber is made (:mod:`rollout_server.net.secrets`) become
    ``[REDACTED]`` in every spelling the policy knows (:class:`~rollout_server.net.secrets.SecretMatcher`,
    the launcher's mechanism too); only then is credential-shaped text
    masked as ``REDACTED``, so a known value is masked whole even where its prefix looks like a
    key. ``extra`` is an outside redactor (the run's) applied last.
    """

    def __init__(
        self, secrets: Iterable[str] = (), extra: Callable[[str], str] | None = None
    ) -> None:
        self._known = SecretMatcher()
        for secret in secrets:
            self._known.add(secret)
        for value in secret_env_values(os.environ):
            self._known.add(value, min_length=AMBIENT_MIN_LENGTH)
        self._extra = extra

    def scrub(self, text: str) -> str:
        """Redact ``text`` without reshaping it (for log lines)."""
        text = self._known.sub(REDACTED, text)
        text = _PATTERNS.sub(_PATTERN_MASK, text)
        if self._extra is not None:
            text = self._extra(text)
        return text

    def __call__(self, text: str) -> str:
        """Redact, collapse whitespace and truncate: the message a rollout is sent."""
        text = _WHITESPACE.sub(" ", self.scrub(text)).strip()
        return text[:MAX_ERROR_MESSAGE]
