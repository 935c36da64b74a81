"""Every relative link in README.md, docs/ and model_cards/ resolves: the file exists, and an anchor (`#section`)
names a heading of the target page, by GitHub's rule for heading anchors."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), REPO / "model_cards" / "README.md"])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.MULTILINE | re.DOTALL)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors: each heading lower-cased, punctuation dropped, spaces made hyphens; repeats get -1, -2."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", page.read_text()), flags=re.MULTILINE):
        text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        unique, count = slug, 0
        while unique in anchors:
            count += 1
            unique = f"{slug}-{count}"
        anchors.add(unique)
    return anchors


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    targets = [inline or image for inline, image in LINK.findall(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # skip https:, mailto:, ...


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{target} (no heading with that anchor in {resolved.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(REPO)}: broken links: {broken_links(page)}"


def test_the_checker_reads_anchors_as_github_makes_them_and_reports_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Notes\n\n## Notes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "## 1. Train a language model from scratch\n\n### Serve: vLLM and SGLang's `transformers` backend\n\n"
        "[a](#1-train-a-language-model-from-scratch) [b](#serve-vllm-and-sglangs-transformers-backend) "
        "[c](other.md#notes-1) [d](other.md) [e](https://example.org/x#y) ![f](other.md)\n\n"
        "[bad anchor](#train) [bad file](missing.md) [bad other](other.md#notes-2)\n\n"
        "```\n[inside a fence](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "#train (no heading with that anchor in page.md)",
        "missing.md (no such file)",
        "other.md#notes-2 (no heading with that anchor in other.md)",
    ]
