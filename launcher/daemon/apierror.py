"""The API's error answer, :class:`ApiError`, and the one check every string a request hands
on to a path, an argument or an environment variable passes (:func:`refuse_nul`).

Its own module so that the modules checking a request (:mod:`launcher.daemon.paths`,
:mod:`launcher.daemon.registry`) raise it without importing each other.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "refuse_nul"]

#: CLI error codes and the HTTP status they map to (anything else: 422).
_STATUS_BY_CODE = {
    "VALIDATION": 400,
    "INTERACTIVE_REQUIRED": 400,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
}


class ApiError(Exception):
    """An error answer: HTTP ``status`` with ``{"error": {"code", "message"}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def from_cli(cls, code: str | None, message: str) -> ApiError:
        """The API form of a CLI error."""
        code = code or "ERROR"
        return cls(_STATUS_BY_CODE.get(code, 422), code, message)


def refuse_nul(key: str, value: Any) -> None:
    """A NUL cannot be in a path, an argument or an environment value: a 400, not a crash."""
    if isinstance(value, str) and "\x00" in value:
        raise ApiError(400, "VALIDATION", f"{key} must not contain a NUL character")
