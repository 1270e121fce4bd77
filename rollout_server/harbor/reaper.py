"""Start-up reaping of what dead rollout servers left: containers, networks, images, scratch.

A rollout server killed with ``kill -9`` (or a machine that lost power) leaves its trials
behind. When a new Harbor backend starts it removes, before serving:

* every container labelled with an owner process that is gone (:mod:`.containers`);
* every staged trial whose owner file names a process that is gone (:mod:`.staging`), with its
  Harbor trial dir, and the compose networks and images of that trial even when it died before
  it had a container (killed while its image was being built);

and says so in one milestone line. Trials of live owners, another run's included, are not
touched, and neither is a trial dir kept on purpose (it has no staging dir).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import containers, staging

__all__ = ["ReapReport", "reap_dead_owners"]


@dataclass
class ReapReport:
    """What :func:`reap_dead_owners` removed."""

    containers: int = 0
    trials: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when there was nothing to reap."""
        return not self.containers and not self.trials


def reap_dead_owners(engine: str | None, trials_root: Path) -> ReapReport:
    """Reap what dead owners left (blocking; run it before serving); print one line if any."""
    report = ReapReport()
    orphaned = containers.orphan_trials(engine) if engine is not None else {}
    stale = staging.stale_trials(trials_root)
    names = sorted({*(n for n in orphaned if n != "?"), *(f"trial-{rid}" for rid in stale)})
    ids = [cid for found in orphaned.values() for cid in found]
    if engine is not None and (ids or names):
        containers.remove_trials(engine, ids, names)
    for rollout_id in stale:
        staging.remove_scratch(trials_root, rollout_id)
    report.containers, report.trials = len(ids), names
    if not report.empty:
        # A milestone line on stdout: reaping runs before the server configures logging.
        print(
            f"harbor: reaped {len(ids)} orphaned container(s) and the scratch of "
            f"{len(stale)} abandoned trial(s) of dead rollout servers (trials {', '.join(names)})",
            flush=True,
        )
    return report
