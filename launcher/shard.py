"""``--shard i/N``: one deterministic part of a run's work items, for running without a cluster.

A shard takes whole rows (a row's ``n`` runs stay together, so per-shard pass@k still means
something): shard ``i`` of ``N`` holds the selected rows whose ``row_index`` is ``i`` modulo
``N``, keeping their ``row_index``. Its manifest records the shard next to the inputs of the
whole selection, so shards of one evaluation differ in that one group and nothing else, and
``rollbridge eval merge`` (:mod:`launcher.merge`) can check exactly that.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.dataset import SelectedRow
from launcher.errors import ValidationError

__all__ = ["SHARD_INPUT", "Shard", "parse_shard"]

#: The manifest input group a sharded run adds (absent from unsharded runs).
SHARD_INPUT = "shard"

# ASCII digits only (\d takes any script's digits, `１/2` among them), a few of them.
_FORM = re.compile(r"\s*([0-9]{1,9})\s*/\s*([0-9]{1,9})\s*", re.ASCII)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``."""

    index: int
    count: int

    @property
    def label(self) -> str:
        """``i/N``, as the flag takes it."""
        return f"{self.index}/{self.count}"

    def row_range(self, selected_rows: int) -> range:
        """The ``row_index`` values of this shard among ``selected_rows`` selected rows."""
        return range(self.index, selected_rows, self.count)

    def rows(self, selected: Sequence[SelectedRow]) -> list[SelectedRow]:
        """This shard's rows of the whole selection, in selection order."""
        return [row for row in selected if row.row_index % self.count == self.index]

    def manifest_value(self) -> dict[str, Any]:
        """The value of the manifest's ``shard`` input group."""
        return {"index": self.index, "count": self.count}


def parse_shard(text: str, selected_rows: int | None = None) -> Shard:
    """Parse ``--shard i/N`` (``0 <= i < N``); with ``selected_rows``, refuse an empty shard."""
    match = _FORM.fullmatch(text)
    if match is None:
        raise ValidationError(f"--shard must look like i/N (for example 0/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ValidationError(
            f"--shard {text.strip()}: N must be at least 1 and i between 0 and N-1"
        )
    shard = Shard(index, count)
    if selected_rows is not None and not shard.row_range(selected_rows):
        raise ValidationError(
            f"--shard {shard.label} holds no rows: the selection has only {selected_rows}"
        )
    return shard
