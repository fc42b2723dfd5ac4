"""The docs hold together: every relative link in README.md and docs/ names a file that exists, and every #anchor
names a heading of that file (GitHub's heading ids)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def heading_ids(path: Path) -> set[str]:
    ids, seen, fence = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence or not re.match(r"#{1,6} ", line):
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def test_every_relative_link_and_anchor_resolves():
    bad = []
    for doc in DOCS:
        for link in relative_links(doc):
            target, _, anchor = link.partition("#")
            path = (doc.parent / target).resolve() if target else doc
            where = f"{doc.relative_to(ROOT)}: {link}"
            if not path.exists():
                bad.append(f"{where}: no such file")
            elif anchor and (path.suffix != ".md" or anchor not in heading_ids(path)):
                bad.append(f"{where}: no such heading")
    assert bad == []
    assert len(DOCS) > 10, "the docs were not found"
