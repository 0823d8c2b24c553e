"""The documentation stays true to the code it describes: the README is a front door (at most
250 lines, the two commands within its first 30), ``docs/usage.md`` names every flag the
parser defines and its table of flags names no other, and every relative link of the README,
CONTRIBUTING.md and ``docs/*.md`` reaches a file and, with ``#anchor``, a heading in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpu_dist.common.flags import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"--[A-Za-z][\w-]*")
pytestmark = pytest.mark.timeout(60)


def prose(path: Path) -> list[str]:
    """The lines of a markdown file outside its fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a file's headings: lower case, punctuation dropped, spaces as -."""
    heads = [line.lstrip("#").strip() for line in prose(path) if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    head = "\n".join(lines[:30])
    assert "bash scripts/run.sh" in head and "bash scripts/test.sh" in head


def test_usage_names_every_flag_of_the_parser_and_its_table_no_other():
    text = (ROOT / "docs/usage.md").read_text()
    parser = {o for a in build_parser()._actions for o in a.option_strings if o != "--help"}
    parser = {o for o in parser if o.startswith("--")}
    missing = sorted(o for o in parser if not re.search(re.escape(o) + r"(?![\w-])", text))
    assert not missing, f"docs/usage.md does not name {missing}"
    table = text.partition("\n## Flags\n")[2].partition("\n## ")[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `--")]
    assert len(rows) > 40
    unknown = sorted({f for row in rows for f in FLAG.findall(row)} - parser)
    assert not unknown, f"docs/usage.md's table of flags names flags the parser lacks: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for line in prose(doc):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(target)
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links that reach nothing: {broken}"
