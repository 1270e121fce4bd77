"""Every citation in a docstring or comment (``docs/spec/… §N``, ``docs/hazards.md #N``) points
at a heading that exists in this repository."""

from __future__ import annotations

from pathlib import Path

from tests.citations import dangling

ROOT = Path(__file__).resolve().parents[1]


#: The checker and its own test quote citation shapes as examples.
SELF = ("tests/citations.py:", "tests/test_citations.py:")


def test_every_citation_resolves() -> None:
    problems = [p for p in dangling(ROOT) if not p.startswith(SELF)]
    assert not problems, "dangling citations:\n" + "\n".join(problems)


def test_the_checker_flags_a_missing_section(tmp_path: Path) -> None:
    (tmp_path / "docs" / "spec").mkdir(parents=True)
    (tmp_path / "docs" / "spec" / "x.md").write_text("# X\n\n## 1. One\n\ntext\n")
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "m.py").write_text(
        '"""See docs/spec/x.md §1 and docs/spec/x.md §2, and docs/nope.md."""\n'
    )
    problems = dangling(tmp_path)
    assert any("§2" in p for p in problems), problems
    assert any("nope.md" in p for p in problems), problems
    assert not any("§1 " in p or p.endswith("§1") for p in problems), problems
