"""``rollbridge init [DIR] [--rollout NAME]``: a workspace that ``rollbridge eval run`` runs at once.

It writes an eval config on the built-in offline model, a small dataset, and a rollout (a
workflow and a grader) whose ``pyproject.toml`` depends on ``rollbridge`` by name, as on any
published package, never on a path: the workspace keeps working when the checkout or the wheel
rollbridge was installed from moves or goes away. Where the package index cannot serve
rollbridge, ``eval run`` hands ``uv sync`` a wheel of the running rollbridge
(:mod:`launcher.selfwheel`).

The templates live in ``launcher/templates/``. Nothing that exists is overwritten: a file in
the way is an error naming it, before anything is written.
"""

from __future__ import annotations

import re
from importlib import metadata, resources
from pathlib import Path
from string import Template

import click

from launcher import completion as complete
from launcher.errors import LocalEvalError

__all__ = ["eval_init", "requirement", "scaffold"]

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def requirement(version: str | None = None) -> str:
    """The rollout's ``dependencies`` entry: rollbridge at least as new as the one running."""
    if version is None:
        try:
            version = metadata.version("rollbridge")
        except metadata.PackageNotFoundError:
            return "rollbridge"
    return f"rollbridge>={version}"


def _template(name: str) -> Template:
    return Template(resources.files("launcher").joinpath("templates", name).read_text("utf-8"))


def scaffold(root: Path, rollout: str, dependency: str | None = None) -> list[Path]:
    """Write the workspace under ``root``; the files written, in order."""
    if not _NAME.match(rollout):
        raise LocalEvalError(
            "--rollout must be a lower-case name that starts with a letter (then letters, "
            f"digits, '-', '_'), got '{rollout}'"
        )
    values = {
        "name": rollout,
        "requirement": requirement() if dependency is None else dependency,
    }
    files = {
        root / "configs" / "eval" / f"{rollout}.toml": _template("eval.toml.tmpl"),
        root / "data" / f"{rollout}.jsonl": _template("data.jsonl"),
        root / "rollouts" / rollout / "main.py": _template("main.py.tmpl"),
        root / "rollouts" / rollout / "pyproject.toml": _template("pyproject.toml.tmpl"),
    }
    if root.exists() and not root.is_dir():
        raise LocalEvalError(f"{root} exists and is not a directory; choose another DIR")
    in_the_way = [p for p in files if p.exists() or p.is_symlink()]
    if in_the_way:
        raise LocalEvalError(f"{in_the_way[0]} already exists; choose another DIR or --rollout")
    written = list(files)
    try:
        for path, template in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(template.substitute(values), encoding="utf-8")
        # The workspace check of this version of rollbridge (and osmosis-ai's) expects it.
        (root / "configs" / "training").mkdir(exist_ok=True)
        gitignore = root / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text(".osmosis/\n.venv/\n", encoding="utf-8")
            written.append(gitignore)
    except OSError as exc:
        where = exc.filename or root
        raise LocalEvalError(
            f"cannot create the workspace at {where}: {exc.strerror or exc}"
        ) from None
    return written


@click.command("init")
@click.argument("directory", default=".", type=str, shell_complete=complete.dirs)
@click.option("--rollout", default="my-rollout", show_default=True, help="Name of the rollout.")
def eval_init(directory: str, rollout: str) -> None:
    """Create a workspace in DIRECTORY that `rollbridge eval run` can run at once."""
    root = Path(directory).expanduser()
    written = scaffold(root, rollout)
    click.echo(f"Created a workspace in {root}:")
    for path in written:
        click.echo(f"  {path}")
    config = Path("configs") / "eval" / f"{rollout}.toml"
    where = "" if root.resolve() == Path.cwd().resolve() else f"cd {directory} && "
    click.echo(f"Run it on the offline model: {where}rollbridge eval run {config} --yes")
