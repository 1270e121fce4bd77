"""Check that every documentation citation in the Python sources resolves inside the repository.

Citations look like ``docs/spec/supervisor.md §6.1``, ``docs/spec/bridge.md §2–§5``,
``docs/spec/protocol.md §9, §19 items 6, 7``, ``docs/spec/supervisor.md §0 steps 1-11``,
``docs/spec/bridge.md §5.4, Appendix A`` or ``docs/hazards.md #3``. A bare ``§N`` (no document
named right before it) refers to the nearest spec document cited earlier in the same file, or,
when there is none earlier, the first one cited later.

A citation resolves when the target file exists and has a Markdown heading numbered like the
section (``## 6. ...``, ``### 6.1 ...``, ``## Appendix A ...``; ``## 3. ...`` for hazard #3);
``items N`` / ``steps N-M`` must be numbered list items (``N.``) inside that section. Every
mention of a ``docs/...md`` path must name an existing file.

``tests/test_citations.py`` runs :func:`dangling` over the repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SOURCE_DIRS", "dangling"]

#: Where citations are looked for (relative to the repository root).
SOURCE_DIRS = ("launcher", "bridge", "rollout_server", "tunnel", "tests", "scripts")

_DOC_PATH = re.compile(r"(?<![\w/.-])(docs/(?:[\w.-]+/)*[\w.-]+\.md)")
_SECTION_ID = r"\d+(?:\.\d+)*"
# One link of a citation chain, right after a document path or a previous link.
_LINK = re.compile(
    r"(?P<sep>\s*(?:,|;|\band\b)?\s*)"
    r"(?:§(?P<sec>" + _SECTION_ID + r")(?:\s*[-–]\s*§?(?P<end>" + _SECTION_ID + r"))?"
    r"|Appendix (?P<appendix>[A-Z])\b"
    r"|(?:items?|steps?) (?P<items>\d+(?:\s*[-–]\s*\d+)?(?:,\s*\d+(?:\s*[-–]\s*\d+)?)*)"
    r"|#(?P<hazard>\d+)\b)"
)
_BARE = re.compile(r"§(?P<sec>" + _SECTION_ID + r")(?:\s*[-–]\s*§?(?P<end>" + _SECTION_ID + r"))?")
_HEADING = re.compile(
    r"^#{1,6}\s+(?:(?P<num>" + _SECTION_ID + r")\.?|Appendix (?P<app>[A-Z]))(?=\s|$)"
)
_LIST_ITEM = re.compile(r"^\s*(\d+)\.\s")


@dataclass
class _Doc:
    """The section numbers of one Markdown file and the list items under each section."""

    sections: set[str] = field(default_factory=set)
    items: dict[str, set[int]] = field(default_factory=dict)


def _parse_doc(path: Path) -> _Doc | None:
    """Headings and numbered list items of a Markdown file; None when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    doc = _Doc()
    current: str | None = None
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = _HEADING.match(line)
        if heading:
            current = heading["num"] or f"Appendix {heading['app']}"
            doc.sections.add(current)
            continue
        item = _LIST_ITEM.match(line)
        if item and current is not None:
            doc.items.setdefault(current, set()).add(int(item.group(1)))
    return doc


def _expand(start: str, end: str | None) -> list[str]:
    """``4.2``..``4.5`` -> every id in between (same prefix); otherwise just the two ends."""
    if end is None:
        return [start]
    a, b = start.split("."), end.split(".")
    if len(a) == len(b) and a[:-1] == b[:-1] and int(a[-1]) <= int(b[-1]):
        prefix = ".".join(a[:-1])
        return [f"{prefix}.{i}" if prefix else str(i) for i in range(int(a[-1]), int(b[-1]) + 1)]
    return [start, end]


def _numbers(text: str) -> list[int]:
    """``"6, 7, 10-12"`` -> ``[6, 7, 10, 11, 12]``."""
    out: list[int] = []
    for part in re.split(r",\s*", text):
        low, _, high = (
            re.split(r"\s*([-–])\s*", part) if re.search("[-–]", part) else [part, "", ""]
        )
        out.extend(range(int(low), int(high or low) + 1))
    return out


@dataclass
class _Citation:
    """One cited section (or a bare document mention when ``section`` is None)."""

    line: int
    target: str
    section: str | None = None
    items: list[int] = field(default_factory=list)


def _citations(source: str) -> list[_Citation]:
    """Every citation of ``source``: chains after a document path, then anchored bare ``§``."""
    found: list[_Citation] = []
    consumed: list[tuple[int, int]] = []
    anchors: list[tuple[int, str]] = []  # (offset, spec document) for bare references

    def line_of(offset: int) -> int:
        return source.count("\n", 0, offset) + 1

    for match in _DOC_PATH.finditer(source):
        target = match.group(1)
        pos = match.end()
        start = match.start()
        if not target.endswith("hazards.md"):
            anchors.append((start, target))
        links: list[_Citation] = []
        while True:
            link = _LINK.match(source, pos)
            # The first link follows the path after whitespace only ("x.md §3", not "x.md, §3").
            if link is None or (not links and link["sep"].strip()):
                break
            if link["sec"]:
                links += [
                    _Citation(line_of(start), target, s) for s in _expand(link["sec"], link["end"])
                ]
            elif link["appendix"]:
                links.append(_Citation(line_of(start), target, f"Appendix {link['appendix']}"))
            elif link["items"]:
                if not links:
                    break
                links[-1].items = _numbers(link["items"])
            else:
                links.append(_Citation(line_of(start), target, link["hazard"]))
            pos = link.end()
        consumed.append((start, pos))
        found.extend(links or [_Citation(line_of(start), target)])

    for match in _BARE.finditer(source):
        if any(a <= match.start() < b for a, b in consumed):
            continue
        before = [doc for offset, doc in anchors if offset < match.start()]
        after = [doc for offset, doc in anchors if offset > match.start()]
        target = before[-1] if before else (after[0] if after else "")
        for sec in _expand(match["sec"], match["end"]):
            found.append(_Citation(line_of(match.start()), target, sec))
    return found


def _problem(citation: _Citation, docs: dict[str, _Doc | None], repo_root: Path) -> str | None:
    """Why ``citation`` does not resolve, or None when it does."""
    if not citation.target:
        return f"§{citation.section} names no document"
    if citation.target not in docs:
        docs[citation.target] = _parse_doc(repo_root / citation.target)
    doc = docs[citation.target]
    if doc is None:
        return f"{citation.target} does not exist"
    if citation.section is None:
        return None
    if citation.section not in doc.sections:
        if citation.section.startswith("Appendix"):
            return f"{citation.target} has no heading {citation.section}"
        mark = "#" if citation.target.endswith("hazards.md") else "§"
        return f"{citation.target} has no heading {mark}{citation.section}"
    missing = [n for n in citation.items if n not in doc.items.get(citation.section, set())]
    if missing:
        return f"{citation.target} §{citation.section} has no item(s) {missing}"
    return None


def dangling(repo_root: Path, dirs: tuple[str, ...] = SOURCE_DIRS) -> list[str]:
    """``<file>:<line>: <problem>`` for every citation in ``dirs`` that does not resolve."""
    repo_root = Path(repo_root)
    docs: dict[str, _Doc | None] = {}
    out: list[str] = []
    for top in dirs:
        for path in sorted((repo_root / top).rglob("*.py")):
            relative = path.relative_to(repo_root)
            if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
                continue
            source = path.read_text(encoding="utf-8", errors="replace")
            seen: set[tuple[int, str]] = set()
            for citation in _citations(source):
                problem = _problem(citation, docs, repo_root)
                key = (citation.line, problem or "")
                if problem is not None and key not in seen:
                    seen.add(key)
                    out.append(f"{relative}:{citation.line}: {problem}")
    return out
