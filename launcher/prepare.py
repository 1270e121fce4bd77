"""Preparing ``rollbridge eval run`` before the trio program starts (docs/spec/supervisor.md §0 steps 1-11).

Everything here is synchronous and has no lifetime: validate the flags, resolve the workspace,
config, dataset and row selection, print the warnings and the plan table. The result is one
frozen-in-spirit :class:`Prepared` record that the supervisor reads and never changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config import (
    EvalConfig,
    RunSpec,
    advanced_keys_warning,
    ignored_batch_size_warning,
    load_eval_config,
    resolve_run_spec,
)
from launcher.config_ray import RaySettings, resolve_ray
from launcher.dataset import DatasetSelection, SelectedRow, select_rows
from launcher.errors import CLIError, ValidationError
from launcher.redact import Redactor
from launcher.report import COMMAND
from launcher.rundir import RunMeta
from launcher.rundir.names import validate_run_name
from launcher.shard import SHARD_INPUT, Shard, parse_shard
from launcher.ui import UI
from launcher.workspace import (
    DatasetSource,
    GitState,
    RolloutPaths,
    Workspace,
    check_entrypoint_exists,
    check_rollout_paths,
    provenance_warnings,
    read_git_state,
    resolve_dataset_source,
    resolve_output_root,
    resolve_workspace,
)
from tunnel.errors import TunnelError
from tunnel.plan import TunnelPlan, validate_tunnel_flags

__all__ = ["EvalOptions", "Prepared", "plan_rows", "plan_title", "prepare"]


@dataclass
class EvalOptions:
    """The flags of ``rollbridge eval run`` (see ``docs/eval-run.md``)."""

    config: str
    name: str | None = None
    output: str | None = None
    dataset_file: str | None = None
    secrets_file: str | None = None
    rows: str | None = None
    limit: int | None = None
    fresh: bool = False
    retry_failed: bool = False
    max_in_flight: int | None = None
    yes: bool = False
    tunnel: str | None = None
    cloudflared: str | None = None
    download_cloudflared: bool = False
    rollout_port: int | None = None
    listener_port: int | None = None
    advertise_url: str | None = None
    verbose: bool = False
    shard: str | None = None
    ray: str | None = None
    ray_min_replicas: int | None = None


@dataclass
class Prepared:
    """Everything resolved before the trio program starts."""

    options: EvalOptions
    cwd: Path
    workspace: Workspace
    config: EvalConfig
    spec: RunSpec
    paths: RolloutPaths
    output_root: Path
    dataset: DatasetSource
    selection: DatasetSelection
    git: GitState | None
    tunnel_plan: TunnelPlan
    redactor: Redactor
    shard: Shard | None = None
    ray: RaySettings | None = None
    """``--ray`` and the config's ``[ray]`` resolved (runtime-only: not a manifest input)."""

    @property
    def rows(self) -> list[SelectedRow]:
        """The rows this invocation runs: the selection, or its ``--shard`` part."""
        if self.shard is None:
            return self.selection.rows
        return self.shard.rows(self.selection.rows)

    def with_shard(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The manifest inputs ``inputs``, with the ``shard`` group in a ``--shard`` run."""
        if self.shard is not None:
            inputs[SHARD_INPUT] = self.shard.manifest_value()
        return inputs

    @property
    def meta(self) -> RunMeta:
        """Facts for projections and metrics."""
        rows = None if self.shard is None else self.shard.row_range(len(self.selection.rows))
        return RunMeta(
            n=self.spec.n,
            pass_threshold=self.spec.pass_threshold,
            sampled_rows=len(self.selection.rows) if rows is None else len(rows),
            total_dataset_rows=self.selection.total_dataset_rows,
            dataset_name=self.dataset.name,
            model_name=self.config.experiment.model_path,
            rollout_name=self.config.experiment.rollout,
            rows=rows,
        )

    def display(self, path: Path) -> str:
        """``path`` relative to the CWD when it lies under it, else absolute."""
        try:
            return str(path.relative_to(self.cwd)) or "."
        except ValueError:
            return str(path)

    def command(self, *extra: str) -> str:
        """A re-run command line: the config, the flags that pin the same inputs, ``extra``,
        then the runtime flags given (concurrency, secrets file, tunnel, Ray: never part of
        the manifest)."""
        parts = [COMMAND, shlex.quote(self.display(self.workspace.config_path))]
        opts = self.options
        if opts.output is not None:
            parts += ["-o", shlex.quote(self.display(self.output_root))]
        if opts.dataset_file is not None:
            parts += ["--dataset-file", shlex.quote(self.display(self.dataset.path))]
        if opts.rows is not None:
            parts += ["--rows", shlex.quote(opts.rows)]
        if opts.limit is not None:
            parts += ["--limit", str(opts.limit)]
        if self.shard is not None:
            parts += ["--shard", self.shard.label]
        parts += list(extra)
        # How it ran: a resume without the secrets file fails on the first required secret,
        # and one without --max-in-flight silently runs at another concurrency.
        if opts.max_in_flight is not None:
            parts += ["--max-in-flight", str(opts.max_in_flight)]
        if opts.secrets_file is not None:
            parts += ["--secrets-file", shlex.quote(opts.secrets_file)]
        parts += [shlex.quote(f) for f in self.tunnel_plan.resume_flags()]
        if opts.cloudflared is not None:
            parts += ["--cloudflared", shlex.quote(opts.cloudflared)]
        if opts.ray is not None:  # as given: "auto" for --ray alone
            parts += ["--ray", shlex.quote(opts.ray.strip())]
        if opts.ray_min_replicas is not None:
            parts += ["--ray-min-replicas", str(opts.ray_min_replicas)]
        return " ".join(parts)


# -- preparation (synchronous) --------------------------------------------------------------


def prepare(options: EvalOptions, ui: UI, cwd: Path | None = None) -> Prepared:
    """Steps 1-11 of docs/spec/supervisor.md §0: validate flags, resolve the workspace, config, dataset and
    selection, and print the warnings and the plan table. Raises :class:`CLIError`."""
    cwd = cwd or Path.cwd()
    redactor = Redactor()
    redactor.add_known_env(os.environ)
    ui.set_redactor(redactor)
    try:
        plan = validate_tunnel_flags(options.tunnel, options.advertise_url, options.listener_port)
    except TunnelError as exc:
        raise ValidationError(str(exc)) from None
    if options.max_in_flight is not None and options.max_in_flight <= 0:
        raise ValidationError(
            f"--max-in-flight must be a positive integer, got {options.max_in_flight}"
        )
    if options.limit is not None and options.limit <= 0:
        # The config's `limit` keeps the reference's reading (0 or less: every row); a flag
        # asking for no rows is a mistake, not a request for all of them.
        raise ValidationError(
            f"--limit must be a positive integer, got {options.limit} "
            "(leave it out to run every row)"
        )
    if options.rollout_port is not None and not 1 <= options.rollout_port <= 65535:
        raise ValidationError(
            f"--rollout-port must be between 1 and 65535, got {options.rollout_port}"
        )
    if options.name is not None:
        validate_run_name(options.name)
    if options.fresh and options.retry_failed:
        raise ValidationError(
            "--fresh and --retry-failed cannot be combined: --fresh starts over, "
            "--retry-failed keeps the successes of the existing run"
        )
    for tunnel_warning in plan.warnings:
        ui.warning(tunnel_warning.message, tunnel_warning.code)

    workspace = resolve_workspace(Path(options.config), cwd)
    config = load_eval_config(workspace.config_path)
    _redact_file_secrets(redactor, options.secrets_file, config.secrets_required, cwd)
    paths = check_rollout_paths(workspace, config.experiment.rollout, config.experiment.entrypoint)
    check_entrypoint_exists(paths)
    spec = resolve_run_spec(config, limit_override=options.limit)
    advanced = advanced_keys_warning(config, COMMAND)
    if advanced:
        ui.warning(advanced, "ADVANCED_KEYS_IGNORED")
    ignored = ignored_batch_size_warning(spec)
    if ignored:
        ui.warning(ignored, "BATCH_SIZE_IGNORED")
    output_root = resolve_output_root(workspace, options.output, cwd)
    if output_root.resolve() == paths.rollout_dir.resolve():
        raise ValidationError(
            f"--output must not be the rollout source directory {paths.rollout_dir}: excluding "
            "the output tree would then exclude the whole project, freezing the resume "
            "fingerprint."
        )
    dataset = resolve_dataset_source(
        workspace, config.experiment.dataset, options.dataset_file, cwd
    )
    selection = select_rows(
        dataset.path,
        rows=options.rows,
        limit=spec.limit,
        name=dataset.name,
        extension=dataset.extension,
    )
    ray = resolve_ray(config.ray, options.ray, options.ray_min_replicas)
    unused = [
        key
        for key in ("min_replicas", "resource")
        if ray is None and config.ray is not None and getattr(config.ray, key) is not None
    ]
    if unused:
        keys = " and ".join(f"[ray] {key}" for key in unused)
        ui.warning(
            f"{keys} of the config apply only to a run on Ray: this run is local (no --ray, no "
            "[ray] address)",
            "RAY_SETTINGS_UNUSED",
        )
    if ray is not None:
        from launcher.cluster.flags import check_ray_flag, this_machines_cluster
        from launcher.cluster.join import token_file_problem

        if ray.address == "auto":
            # Said as the user wrote it: the flag, or the config's address.
            via = '[ray] address = "auto"' if options.ray is None else "--ray without an address"
            ray = dataclasses.replace(ray, address=this_machines_cluster(os.environ, via=via))
        check_ray_flag(ray.address, os.environ)
        if problem := token_file_problem(os.environ):
            # Before anything starts (the rollout environment, its server), not at the join.
            raise ValidationError(
                f"--ray: {problem}; point it at the file holding the token the cluster's "
                "nodes were started with (or set RAY_AUTH_TOKEN)"
            )
    shard = None if options.shard is None else parse_shard(options.shard, len(selection.rows))
    git = read_git_state(workspace.root)
    for warning in provenance_warnings(config, git):
        ui.warning(warning, "PROVENANCE_MISMATCH")
    prepared = Prepared(
        options=options,
        cwd=cwd,
        workspace=workspace,
        config=config,
        spec=spec,
        paths=paths,
        output_root=output_root,
        dataset=dataset,
        selection=selection,
        git=git,
        tunnel_plan=plan,
        redactor=redactor,
        shard=shard,
        ray=ray,
    )
    ui.plan_table(plan_rows(prepared), plan_title(prepared))
    return prepared


def _redact_file_secrets(
    redactor: Redactor, secrets_file: str | None, required: tuple[str, ...], cwd: Path
) -> None:
    """Known from here on: the ``--secrets-file`` values the run will treat as secrets (the
    ``[secrets]`` it names, the provider keys; launcher.services redacts the same once it
    reads the file), so an error of the checks that follow (a dataset path, a ``--rows``
    value) prints none. The file is read again, with its own errors, by the services; stdin
    (``-``) can be read once only, so it is read there alone."""
    if secrets_file in (None, "-"):
        return
    from launcher.rollout_child import is_provider_env_name
    from launcher.secrets import provider_values, read_secrets_file

    with contextlib.suppress(CLIError):
        values = read_secrets_file(secrets_file, cwd=cwd)
        for name in required:
            redactor.add(values.get(name))
        for value in provider_values(values, is_provider_env_name).values():
            redactor.add(value)


def plan_title(p: Prepared) -> str:
    """The plan table's title (§10.1): "Local Evaluation", as the reference says, unless the
    rollouts run on a Ray cluster, which the title then names (``local``: the run's own)."""
    if p.ray is None:
        return "Local Evaluation"
    return f"Evaluation on Ray ({p.ray.address})"


def plan_rows(p: Prepared) -> list[tuple[str, str]]:
    """The rows of the plan table (§10.1)."""
    exp = p.config.experiment
    rows = [
        ("Rollout", exp.rollout),
        ("Entrypoint", exp.entrypoint),
        ("Model", exp.model_path),
        ("Dataset", f"{p.dataset.name} ({p.dataset.source})"),
    ]
    if exp.branch:
        rows.append(("Branch", exp.branch))
    if exp.commit_sha:
        rows.append(("Commit", exp.commit_sha))
    rows.append(("Rows", f"{len(p.selection.rows)} of {p.selection.total_dataset_rows}"))
    if p.shard is not None:
        rows.append(("Shard", f"{p.shard.label}: {len(p.rows)} rows"))
    if p.ray is not None:
        least = (
            f", halt below {p.ray.min_replicas} healthy replicas" if p.ray.min_replicas > 1 else ""
        )
        rows.append(("Ray", f"{p.ray.address}{least}"))
    if p.spec.n > 1:
        rows.append(("Runs Per Row", str(p.spec.n)))
    rows.append(("Work Items", str(len(p.rows) * p.spec.n)))
    rows.append(("Output", p.display(p.output_root)))
    return rows
