"""The user documentation (README.md and docs/*.md) is written for users: it names no issue-tracker numbers (the
history that needs them is CHANGELOG.md's), neither do the results files it points to, and every relative link and
image in it, CHANGELOG.md's included, resolves: to a file that exists and, with a #fragment, to a heading of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED_DOCS = [*USER_DOCS, ROOT / "CHANGELOG.md"]
RESULTS = [ROOT / "benchmarks" / "results", ROOT / "research" / "results"]
TRACKER_NUMBER = re.compile(r"(?i)\bissues?\s*#?\d+")
"""'issue 43', 'Issue 28's leads', 'issues 27 and 42', 'issue #5', and file names such as issue43_default.json."""
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
RESULTS_PATH = re.compile(r"((?:benchmarks|research)/results)/([\w.{},*-]+)")


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _anchors(path: Path) -> set[str]:
    """The fragments GitHub gives the headings of a Markdown file: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for _, line in _prose(path):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            anchor = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            if count:
                seen[f"{anchor}-{count}"] = 1
    return set(seen)


def _expand(pattern: str) -> list[str]:
    """Shell-style braces, as the docs write a family of results: ``x{,_long}.{json,md}``."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [
        name
        for option in match[1].split(",")
        for name in _expand(pattern[: match.start()] + option + pattern[match.end() :])
    ]


@pytest.mark.parametrize("path", USER_DOCS, ids=_ids)
def test_user_docs_name_no_tracker_numbers(path):
    hits = [f"{path.name}:{n}: {m[0]!r}" for n, line in enumerate(path.read_text().splitlines(), 1)
            for m in TRACKER_NUMBER.finditer(line)]  # fmt: skip
    assert not hits, "say what it is (the third round of default tuning, 2026-11-26), not its issue: " + "; ".join(hits)


def test_results_files_name_no_tracker_numbers():
    hits = [
        path.name
        for folder in RESULTS
        for path in folder.iterdir()
        if TRACKER_NUMBER.search(path.name.replace("_", " "))
    ]
    assert not hits, f"name results by what they measured: {hits}"


@pytest.mark.parametrize("path", USER_DOCS, ids=_ids)
def test_results_files_the_docs_name_exist_and_name_no_tracker_numbers(path):
    named = {
        (folder, name)
        for _, line in _prose(path)
        for folder, pattern in RESULTS_PATH.findall(line)
        for name in _expand(pattern)
    }
    named = {(folder, name.rstrip(".,")) for folder, name in named if "*" not in name and name.rstrip(".,")}
    assert not [name for _, name in named if TRACKER_NUMBER.search(name.replace("_", " "))]
    missing = sorted(f"{folder}/{name}" for folder, name in named if not (ROOT / folder / name).exists())
    assert not missing, f"{path.name} names results that do not exist: {missing}"


@pytest.mark.parametrize("path", LINKED_DOCS, ids=_ids)
def test_links_resolve(path):
    broken = []
    for number, line in _prose(path):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append(f"{path.name}:{number}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
                broken.append(f"{path.name}:{number}: {target} (no such heading in {linked.name})")
    assert not broken, "; ".join(broken)


def test_the_anchor_rule_matches_githubs():
    page = ROOT / "docs" / "history.md"
    assert "where-the-hyper-gradients-variance-comes-from-2026-11-26" in _anchors(page)
    assert _expand("search_by_lml{,_small}.{json,md}") == [
        "search_by_lml.json",
        "search_by_lml.md",
        "search_by_lml_small.json",
        "search_by_lml_small.md",
    ]
    assert TRACKER_NUMBER.search("Issue 28's leads") and TRACKER_NUMBER.search("issues 27 and 42")
    assert TRACKER_NUMBER.search("benchmarks/results/issue43_default.json")
    assert not TRACKER_NUMBER.search("tissue 4") and not TRACKER_NUMBER.search("the issue is 3 rad")


def test_the_model_coverage_table_is_the_sweeps():
    """docs/conversion.md's rows of torchvision's other families are benchmarks/results/model_coverage.json's."""
    summary = json.loads((ROOT / "benchmarks" / "results" / "model_coverage.json").read_text())["summary"]
    text = (ROOT / "docs" / "conversion.md").read_text()
    for line in summary["families"]:
        family = line["family"].replace("_", " ")
        row = f"| {family} | {line['tried']} | {line['passed']} | {line['traced']} | {line['untraced']} |"
        assert row in text, row
