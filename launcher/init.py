"""``rollbridge init [DIR] [--rollout NAME]``: a workspace that ``rollbridge eval run`` runs at once.

It writes an eval config on the built-in offline model, a small dataset, and a rollout (a
workflow and a grader) whose ``pyproject.toml`` depends on the rollbridge that runs this
command, found the way pip recorded its install (``direct_url.json``, PEP 610):

* installed from a directory (a checkout, ``pip install -e .``): a uv path source to it,
  editable when the install is;
* installed from a wheel file that still exists: a uv path source to that file;
* installed from a package index (no record, or a remote URL): ``rollbridge==<version>``, which
  uv resolves from the index like any dependency.

The templates live in ``launcher/templates/``. Nothing that exists is overwritten: a file in
the way is an error naming it, before anything is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from string import Template
from urllib.parse import unquote, urlsplit

import click

from launcher.errors import LocalEvalError

__all__ = ["RollbridgeSource", "eval_init", "installed_source", "scaffold"]

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class RollbridgeSource:
    """How a rollout's ``pyproject.toml`` names rollbridge."""

    requirement: str
    """The ``dependencies`` entry."""
    path: Path | None = None
    """A local directory or wheel for ``[tool.uv.sources]``, when installed from one."""
    editable: bool = False

    def sources_table(self) -> str:
        """The ``[tool.uv.sources]`` table (empty when rollbridge comes from an index)."""
        if self.path is None:
            return ""
        entry = f"path = {json.dumps(str(self.path))}"
        if self.editable:
            entry += ", editable = true"
        return (
            "\n[tool.uv.sources]\n"
            "# The rollbridge that ran `rollbridge init` (not on a package index).\n"
            f"rollbridge = {{ {entry} }}\n"
        )


def installed_source(dist: metadata.Distribution | None = None) -> RollbridgeSource:
    """Where the running rollbridge was installed from (see the module docstring)."""
    if dist is None:
        dist = metadata.distribution("rollbridge")
    version = dist.version
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    url = direct.get("url") if isinstance(direct, dict) else None
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is not None and parts.scheme == "file":
        path = Path(unquote(parts.path))
        if isinstance(direct.get("dir_info"), dict) and path.is_dir():
            editable = bool(direct["dir_info"].get("editable"))
            return RollbridgeSource("rollbridge", path, editable)
        if path.suffix == ".whl" and path.is_file():
            return RollbridgeSource("rollbridge", path)
    return RollbridgeSource(f"rollbridge=={version}")


def _template(name: str) -> Template:
    return Template(resources.files("launcher").joinpath("templates", name).read_text("utf-8"))


def scaffold(root: Path, rollout: str, source: RollbridgeSource) -> list[Path]:
    """Write the workspace under ``root``; the files written, in order."""
    if not _NAME.match(rollout):
        raise LocalEvalError(
            f"--rollout must be a lower-case name (letters, digits, '-', '_'), got '{rollout}'"
        )
    values = {
        "name": rollout,
        "requirement": source.requirement,
        "sources": source.sources_table(),
    }
    files = {
        root / "configs" / "eval" / f"{rollout}.toml": _template("eval.toml.tmpl"),
        root / "data" / f"{rollout}.jsonl": _template("data.jsonl"),
        root / "rollouts" / rollout / "main.py": _template("main.py.tmpl"),
        root / "rollouts" / rollout / "pyproject.toml": _template("pyproject.toml.tmpl"),
    }
    in_the_way = [p for p in files if p.exists() or p.is_symlink()]
    if in_the_way:
        raise LocalEvalError(f"{in_the_way[0]} already exists; choose another DIR or --rollout")
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.substitute(values), encoding="utf-8")
    # The workspace check of this version of rollbridge (and osmosis-ai's) expects it.
    (root / "configs" / "training").mkdir(exist_ok=True)
    gitignore = root / ".gitignore"
    written = list(files)
    if not gitignore.exists():
        gitignore.write_text(".osmosis/\n.venv/\n", encoding="utf-8")
        written.append(gitignore)
    return written


@click.command("init")
@click.argument("directory", default=".", type=str)
@click.option("--rollout", default="my-rollout", show_default=True, help="Name of the rollout.")
def eval_init(directory: str, rollout: str) -> None:
    """Create a workspace in DIRECTORY that `rollbridge eval run` can run at once."""
    root = Path(directory).expanduser()
    try:
        source = installed_source()
    except metadata.PackageNotFoundError:
        raise LocalEvalError(
            "rollbridge is not installed as a distribution (running from a source tree?); "
            "install it with pip install -e '.[cli]'"
        ) from None
    written = scaffold(root, rollout, source)
    click.echo(f"Created a workspace in {root}:")
    for path in written:
        click.echo(f"  {path}")
    config = Path("configs") / "eval" / f"{rollout}.toml"
    where = "" if root.resolve() == Path.cwd().resolve() else f"cd {directory} && "
    click.echo(f"Run it on the offline model: {where}rollbridge eval run {config} --yes")
