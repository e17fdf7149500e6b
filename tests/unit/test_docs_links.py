"""Every relative link in README.md and docs/*.md leads to a file that exists, and a
link to a heading (`page.md#heading`) to a heading that page has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A Markdown inline link: [text](target), the target without spaces.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*```")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(m.group(1)) for line in prose_lines(page.read_text(encoding="utf-8"))
            if (m := HEADING.match(line))}


def broken_links(page: Path) -> list[str]:
    broken = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_resolves() -> None:
    problems = [f"{page.relative_to(ROOT)}: {b}" for page in pages() for b in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if f"(docs/{p.name}" not in readme]
    assert not unlinked, "README.md does not link: " + ", ".join(unlinked)


def test_anchors_and_broken_links_are_found(tmp_path: Path) -> None:
    assert anchor("Jobs that fail at start are held, with the reason") == (
        "jobs-that-fail-at-start-are-held-with-the-reason")
    assert anchor("The simulator (`make bench`)") == "the-simulator-make-bench"
    assert anchor("`policy.reserve`") == "policyreserve"
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Here\n")
    page.write_text("[ok](b.md#here) [web](https://example.org) [x](c.md) [y](b.md#there)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["c.md (no such file)", "b.md#there (no such heading)"]
