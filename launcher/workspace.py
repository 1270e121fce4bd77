"""The workspace (docs/spec/supervisor.md §0, §2.1, §5.1): where the config, rollouts and data live.

There is no platform and no git requirement: the workspace is the directory holding the
``configs/eval/`` that contains the config. Git state is read best effort, for provenance.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launcher.config import EvalConfig
from launcher.errors import LocalEvalError, NotFoundError, ValidationError

__all__ = [
    "DATASET_EXTENSIONS",
    "DatasetSource",
    "GitState",
    "RolloutPaths",
    "Workspace",
    "check_entrypoint_exists",
    "check_rollout_paths",
    "output_root",
    "provenance_warnings",
    "read_git_state",
    "resolve_dataset_source",
    "resolve_output_root",
    "resolve_workspace",
]

#: What a local eval needs; ``configs/training/`` (the platform's) is not required here.
REQUIRED_DIRS = ("rollouts", "configs/eval", "data")
DATASET_EXTENSIONS = ("csv", "jsonl", "parquet")
_GIT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Workspace:
    """A resolved workspace: ``root`` holds ``rollouts/``, ``configs/`` and ``data/``."""

    root: Path
    config_path: Path

    @property
    def config_relpath(self) -> str:
        """The config path relative to the workspace, POSIX style (for the manifest)."""
        return PurePosixPath(*self.config_path.relative_to(self.root).parts).as_posix()

    @property
    def rollouts_dir(self) -> Path:
        """``<root>/rollouts``."""
        return self.root / "rollouts"

    @property
    def data_dir(self) -> Path:
        """``<root>/data``."""
        return self.root / "data"

    @property
    def default_output_root(self) -> Path:
        """``<root>/.osmosis/evals``: where run directories go without ``-o``."""
        return self.root / ".osmosis" / "evals"


@dataclass(frozen=True)
class RolloutPaths:
    """Absolute paths of a rollout directory and its entrypoint (not yet checked to exist)."""

    rollout_dir: Path
    entrypoint: Path


@dataclass(frozen=True)
class DatasetSource:
    """The dataset file to read. ``source`` is ``explicit`` (``--dataset-file``) or ``workspace``."""

    path: Path
    name: str
    source: str
    extension: str


@dataclass(frozen=True)
class GitState:
    """Git provenance of the workspace (best effort). ``branch`` is None when detached."""

    head: str
    branch: str | None
    dirty: bool


def resolve_workspace(config_path: Path, cwd: Path) -> Workspace:
    """Find the workspace of ``config_path`` (relative to ``cwd``) and check its layout.

    The config must be a ``.toml`` file under ``<workspace>/configs/eval/``; the nearest such
    ancestor is the workspace. The directories ``rollouts/``, ``configs/eval/`` and ``data/``
    must exist.
    """
    resolved = (cwd / Path(config_path).expanduser()).resolve()
    if resolved.suffix != ".toml":
        raise ValidationError(
            f"config {resolved} must be a .toml file under <workspace>/configs/eval/"
        )
    if not resolved.exists():
        # Said first: where a config that is not there should live is beside the point.
        raise ValidationError(f"Config file not found: {resolved}")
    root: Path | None = None
    for parent in resolved.parents:
        if parent.name == "eval" and parent.parent.name == "configs":
            root = parent.parent.parent
            break
    if root is None:
        raise ValidationError(
            f"config {resolved} must live under <workspace>/configs/eval/; "
            "move it there or pass the path of a config inside a workspace"
        )
    missing = [d for d in REQUIRED_DIRS if not (root / d).is_dir()]
    if missing:
        listed = ", ".join(f"{d}/" for d in missing)
        raise ValidationError(
            f"workspace {root} is missing {listed}; a workspace needs rollouts/, configs/eval/ "
            "and data/ directories"
        )
    return Workspace(root=root, config_path=resolved)


def check_rollout_paths(workspace: Workspace, rollout: str, entrypoint: str) -> RolloutPaths:
    """Check that the rollout and entrypoint stay inside the workspace (§2.1); no file checks."""
    if Path(rollout).is_absolute() or PurePosixPath(rollout).is_absolute():
        raise ValidationError("Evaluation rollout must be a logical rollout name.")
    if rollout in ("", ".", ".."):
        raise ValidationError(f"Evaluation rollout '{rollout}' is not a valid rollout name.")
    if "/" in rollout or "\\" in rollout:
        raise ValidationError(
            f"Evaluation rollout '{rollout}' must be a single-segment name (no path separators)."
        )
    rollouts = workspace.rollouts_dir.resolve()
    rollout_dir = (rollouts / rollout).resolve()
    if rollout_dir.parent != rollouts:
        raise ValidationError(
            f"Evaluation rollout '{rollout}' must resolve under rollouts/ within the current "
            "workspace directory."
        )
    entry = (rollout_dir / entrypoint).resolve()
    if not entry.is_relative_to(rollout_dir) or entry == rollout_dir:
        raise ValidationError(
            f"Evaluation entrypoint must resolve under rollouts/{rollout}/ within the current "
            "workspace directory."
        )
    return RolloutPaths(rollout_dir=rollout_dir, entrypoint=entry)


def check_entrypoint_exists(paths: RolloutPaths) -> None:
    """Raise when the rollout's directory or its entrypoint file is missing: checked before the
    run directory is made, so the mistake leaves nothing behind (the server's start checks the
    entrypoint again, §2.1)."""
    if not paths.rollout_dir.is_dir():
        parent = paths.rollout_dir.parent
        try:
            found = sorted(p.name for p in parent.iterdir() if p.is_dir())
        except OSError:
            found = []
        there = f"; rollouts/ holds {', '.join(found)}" if found else f"; {parent} has no rollouts"
        raise NotFoundError(
            f"rollout directory {paths.rollout_dir} does not exist; check experiment.rollout"
            + there
        )
    if not paths.entrypoint.is_file():
        raise NotFoundError(
            f"rollout entrypoint {paths.entrypoint} does not exist; "
            "check experiment.rollout and experiment.entrypoint"
        )


def _extension(path: Path) -> str:
    return path.suffix.lower().lstrip(".")


def _check_extension(path: Path) -> str:
    ext = _extension(path)
    if ext not in DATASET_EXTENSIONS:
        shown = ext or "(none)"
        raise ValidationError(
            f"{path} has extension '{shown}' ; expected one of {list(DATASET_EXTENSIONS)}"
        )
    return ext


def resolve_dataset_source(
    workspace: Workspace, dataset: str, dataset_file: str | None, cwd: Path
) -> DatasetSource:
    """The dataset file: ``--dataset-file`` when given, else ``experiment.dataset`` under ``data/``.

    A workspace dataset name is tried as given, then with ``.jsonl``, ``.csv``, ``.parquet``;
    it must stay inside ``data/``.
    """
    if dataset_file is not None:
        path = (cwd / Path(dataset_file).expanduser()).resolve()
        if not path.is_file():
            raise NotFoundError(f"--dataset-file {dataset_file} is not a file")
        return DatasetSource(
            path=path, name=path.name, source="explicit", extension=_check_extension(path)
        )
    data_dir = workspace.data_dir.resolve()
    # A name that already has a dataset extension is tried as given only (no `qa.jsonl.jsonl`).
    has_extension = dataset.rpartition(".")[2].lower() in DATASET_EXTENSIONS and "." in dataset
    names = [dataset] + (
        [] if has_extension else [f"{dataset}.{ext}" for ext in ("jsonl", "csv", "parquet")]
    )
    candidates = [data_dir / name for name in names]
    for candidate in candidates:
        resolved = candidate.resolve()
        if not resolved.is_relative_to(data_dir):
            raise ValidationError(
                f"experiment.dataset '{dataset}' must name a file inside {data_dir}"
            )
        if resolved.is_file():
            return DatasetSource(
                path=resolved,
                name=resolved.name,
                source="workspace",
                extension=_check_extension(resolved),
            )
    tried = f" (tried {', '.join(names)})" if len(names) > 1 else ""
    raise NotFoundError(
        f"dataset '{dataset}' not found in {data_dir}{tried}; add the file there or pass "
        "--dataset-file"
    )


def resolve_output_root(workspace: Workspace, output: str | None, cwd: Path) -> Path:
    """The output root: ``-o`` (``~`` expanded, relative to ``cwd``) or ``<ws>/.osmosis/evals``.

    It need not exist yet, but the nearest part of it that does must be a directory: a regular
    file there is refused now rather than failing deep inside the first write.
    """
    if output is None:
        root = workspace.default_output_root.resolve()
        flag = "the output root"
    else:
        root = (cwd / Path(output).expanduser()).resolve()
        flag = f"-o {output}"
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is" if existing == root else f"is under {existing}, which is"
        raise ValidationError(f"{flag} {what} a file, not a directory; choose a directory")
    return root


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip()


def read_git_state(root: Path) -> GitState | None:
    """HEAD, branch and dirty flag when ``root`` is inside a git worktree; None otherwise."""
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if not head:
        return None
    branch = _git(root, "symbolic-ref", "--short", "-q", "HEAD") or None
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    return GitState(head=head, branch=branch, dirty=bool(status))


def provenance_warnings(config: EvalConfig, git: GitState | None) -> list[str]:
    """Warnings when the config pins a commit or branch that differs from the checkout (§10.1)."""
    warnings: list[str] = []
    if git is None:
        return warnings
    commit = config.experiment.commit_sha
    if commit and not git.head.lower().startswith(commit.lower()):
        warnings.append(
            f"config pins commit {commit} but the workspace is at {git.head}; "
            "the local run executes the workspace as it is."
        )
    branch = config.experiment.branch
    if branch and branch != git.branch:
        current = git.branch or "(detached HEAD)"
        warnings.append(
            f"config names branch '{branch}' but the workspace is on '{current}'; "
            "the local run executes the workspace as it is."
        )
    return warnings


def output_root(output: str | None, cwd: Path) -> Path:
    """The output root of ``eval list``/``clean``/``export`` and of run-name completion: ``output``
    if given, else the ``.osmosis/evals`` of the nearest workspace at or above ``cwd``."""
    if output is not None:
        return (cwd / Path(output).expanduser()).resolve()
    for candidate in (cwd, *cwd.parents):
        if (candidate / "configs" / "eval").is_dir() or (candidate / ".osmosis" / "evals").is_dir():
            return candidate / ".osmosis" / "evals"
    raise LocalEvalError(
        f"no workspace at or above {cwd} (a directory with configs/eval/ or .osmosis/evals/); "
        "run this inside a workspace or pass -o <output root>"
    )
