"""``[secrets]`` resolution and scoping (docs/spec/supervisor.md §8.1, §8.2).

Values come from ``--secrets-file`` (dotenv, parsed by python-dotenv; ``-`` = stdin), then the
process environment (non-empty values only), then a hidden interactive prompt. Provider keys
and settings in the file (:func:`provider_values`) are for the bridge, whether or not
``[secrets]`` lists them. No secret value ever appears in an
exception message: errors name the variable or the line number, never the content.
"""

from __future__ import annotations

import getpass
import io
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from launcher.errors import InteractiveRequiredError, NotFoundError, ValidationError

__all__ = [
    "parse_secrets_text",
    "provider_values",
    "read_secrets_file",
    "resolve_secrets",
    "scoped_environ",
]


def parse_secrets_text(text: str, source: str) -> dict[str, str]:
    """Parse a dotenv file's text as python-dotenv does (what every ``.env`` user expects):
    ``#`` comments, inline comments after a value (``KEY=abc # staging`` is ``abc``),
    ``export``, single quotes literal, double quotes with escapes and several lines; later
    duplicates win; no ``${VAR}`` interpolation. ``source`` names the file in errors, which
    give the line number, never the content.
    """
    from dotenv.parser import parse_stream

    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.key is None and not binding.error:
            continue  # a blank or comment line
        if binding.error or binding.value is None or not (binding.key or "").isidentifier():
            raise ValidationError(
                f"Invalid line {binding.original.line} in {source}: expected NAME=value."
            )
        assert binding.key is not None
        values[binding.key] = binding.value
    return values


def read_secrets_file(spec: str, *, cwd: Path, stdin: TextIO | None = None) -> dict[str, str]:
    """Read ``--secrets-file`` (``-`` reads ``stdin``, default ``sys.stdin``)."""
    if spec == "-":
        return parse_secrets_text((stdin or sys.stdin).read(), "stdin")
    path = (cwd / Path(spec).expanduser()).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"--secrets-file {spec} does not exist") from None
    except IsADirectoryError:
        raise ValidationError(f"--secrets-file {spec} is a directory; give a dotenv file") from None
    except (OSError, UnicodeDecodeError) as exc:
        # The exception text names the file, never its content.
        raise ValidationError(f"cannot read --secrets-file {spec}: {type(exc).__name__}") from None
    return parse_secrets_text(text, str(path))


def resolve_secrets(
    names: Sequence[str],
    *,
    file_values: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    interactive: bool = False,
    prompt: Callable[[str], str] | None = None,
) -> dict[str, str]:
    """Resolve each name: ``file_values``, then a non-empty ``environ`` value, then ``prompt``.

    ``prompt`` (default: hidden ``getpass``) is used only when ``interactive``; an empty answer
    is refused. Names still missing raise ``INTERACTIVE_REQUIRED`` listing them all.
    Callers should read the secrets file only when ``names`` is non-empty (§8.1).
    """
    env = os.environ if environ is None else environ
    files = file_values or {}
    ask = prompt or getpass.getpass
    resolved: dict[str, str] = {}
    missing: list[str] = []
    for name in names:
        if name in files:
            resolved[name] = files[name]
        elif env.get(name):
            resolved[name] = env[name]
        elif interactive:
            answer = ask(f"Value for {name}: ")
            if not answer:
                raise ValidationError(f"Secret value for {name} must not be empty.")
            resolved[name] = answer
        else:
            missing.append(name)
    if missing:
        raise InteractiveRequiredError(
            f"No value found for: {', '.join(missing)}. Export them or pass --secrets-file.",
            details={"missing": missing, "flags": ["--secrets-file"]},
        )
    return resolved


def provider_values(
    file_values: Mapping[str, str], is_provider_name: Callable[[str], bool]
) -> dict[str, str]:
    """The provider keys and settings of a secrets file (names ``is_provider_name`` accepts:
    the ones the rollout server never inherits). They are set in the supervisor's environment
    for the run, so the bridge and the model preflight use them, the file winning over the
    environment; the rollout gets one only when ``[secrets]`` or ``[env]`` names it."""
    return {name: value for name, value in file_values.items() if is_provider_name(name) and value}


@contextmanager
def scoped_environ(
    values: Mapping[str, str], environ: MutableMapping[str, str] | None = None
) -> Iterator[None]:
    """Set ``values`` in the environment for the block, then restore exactly what was there."""
    env = os.environ if environ is None else environ
    saved = {name: env.get(name) for name in values}
    try:
        env.update(values)
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                env.pop(name, None)
            else:
                env[name] = old
