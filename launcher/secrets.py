"""``[secrets]`` resolution and scoping (docs/spec/supervisor.md §8.1, §8.2).

Values come from ``--secrets-file`` (dotenv; ``-`` = stdin), then the process environment
(non-empty values only), then a hidden interactive prompt. No secret value ever appears in an
exception message: errors name the variable or the line number, never the content.
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from launcher.errors import InteractiveRequiredError, NotFoundError, ValidationError

__all__ = ["parse_secrets_text", "read_secrets_file", "resolve_secrets", "scoped_environ"]


def parse_secrets_text(text: str, source: str) -> dict[str, str]:
    """Parse dotenv-style ``NAME=value`` lines (§8.1). ``source`` names the file in errors.

    Blank and ``#`` lines are skipped; ``export `` is allowed; one pair of matching surrounding
    quotes is removed; no escapes, no inline comments; later duplicates win.
    """
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if name.startswith("export "):
            name = name[len("export ") :].strip()
        if not sep or not name.isidentifier():
            raise ValidationError(
                f"Invalid line {lineno} in {source}: expected NAME=value. "
                "Values spanning multiple lines are not supported."
            )
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[name] = value
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
