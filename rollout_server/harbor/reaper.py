"""Start-up reaping of what dead rollout servers left: containers, networks, images, scratch.

A rollout server killed with ``kill -9`` (or a machine that lost power) leaves its trials
behind. When a new Harbor backend starts it removes, before serving:

* every container labelled with an owner process that is gone (:mod:`.containers`);
* every staged trial whose owner file names a process that is gone (:mod:`.staging`), with its
  Harbor trial dir, and the compose networks and images of that trial even when it died before
  it had a container (killed while its image was being built);
* every Harbor trial dir that no staged trial owns and that was not kept on purpose, once ten
  minutes old (:func:`.staging.orphan_trial_dirs`: a Harbor process that outlived its server
  wrote it after the reaping above);

and says so in one milestone line (a second one for the trial dirs alone). Trials of live
owners, another run's included, are not touched, and neither is a trial dir kept on purpose
(:data:`.archive.KEPT_MARK`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import containers, staging

__all__ = ["ReapReport", "reap_dead_owners"]


@dataclass
class ReapReport:
    """What :func:`reap_dead_owners` removed."""

    containers: int = 0
    trials: list[str] = field(default_factory=list)
    #: Harbor trial dirs that nothing owned (names).
    trial_dirs: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when there was nothing to reap."""
        return not self.containers and not self.trials and not self.trial_dirs


def reap_dead_owners(engine: str | None, trials_root: Path) -> ReapReport:
    """Reap what dead owners left (blocking; run it before serving); print a line for what
    was reaped, and one for the trial dirs nothing owned, if any."""
    report = ReapReport()
    orphaned = containers.orphan_trials(engine) if engine is not None else {}
    stale = staging.stale_trials(trials_root)
    names = sorted({*(n for n in orphaned if n != "?"), *(f"trial-{rid}" for rid in stale)})
    ids = [cid for found in orphaned.values() for cid in found]
    if engine is not None and (ids or names):
        containers.remove_trials(engine, ids, names)
    for rollout_id in stale:
        staging.remove_scratch(trials_root, rollout_id)
    for trial_dir in staging.orphan_trial_dirs(trials_root):
        shutil.rmtree(trial_dir, ignore_errors=True)
        report.trial_dirs.append(trial_dir.name)
    if report.trial_dirs:
        print(
            f"harbor: removed {len(report.trial_dirs)} Harbor trial dir(s) under "
            f"{trials_root / 'trials'} that no trial owned (left by rollout servers that died "
            "mid-trial, or kept by an older rollbridge)",
            flush=True,
        )
    report.containers, report.trials = len(ids), names
    if ids or names or stale:
        # A milestone line on stdout: reaping runs before the server configures logging.
        print(
            f"harbor: reaped {len(ids)} orphaned container(s) and the scratch of "
            f"{len(stale)} abandoned trial(s) of dead rollout servers (trials {', '.join(names)})",
            flush=True,
        )
    return report
