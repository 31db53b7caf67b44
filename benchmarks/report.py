"""Generate docs/benchmarks.md (and the results' Markdown companions) from the JSON results.

The hand-written commentary lives in a template (``benchmarks/report_template.md``: what training learns with
today's defaults, the comparisons, the costs). Each line of a template of the form ``{{table NAME FILE}}``
(indented or not) becomes the provenance line of the results file ``FILE`` (date, machine, device, torch, commit
from its ``meta``) and the table ``TABLES[NAME]`` renders from it, indented as the placeholder is. ``FILE`` is a
name in the page's results folders (the first that holds it) or a path from the repository root. So the tables
never drift from the results: ``tests/test_benchmark_report.py`` checks that regenerating gives exactly the
committed files, and that every results file is on one of the pages. ``python -m research.report`` renders the
research pages (docs/research.md, docs/history.md) with the same :func:`render`.

    python -m benchmarks.report            # rewrite docs/benchmarks.md and benchmarks/results/*.md
    python -m benchmarks.report --check    # exit 1 if any of them is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import tables
from benchmarks.common import RESULTS, ROOT, load_results, provenance, write_text

TEMPLATE = ROOT / "benchmarks" / "report_template.md"
OUT = ROOT / "docs" / "benchmarks.md"
PAGES = {OUT: TEMPLATE}
"""Each generated page and the template it is rendered from."""
PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)\{\{table (?P<name>\w+) (?P<file>[\w./-]+\.json)\}\}$")
# results whose Markdown companion (FILE.md beside FILE.json) holds these tables
COMPANIONS = {
    "hyperparameter_methods.json": (tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    "hyperparameter_methods_long.json": (tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    "hyperparameter_methods_wide.json": (tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    "hyperparameter_methods_zero.json": (tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    "hyperparameter_methods_round3.json": (tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    "hyperparameter_methods_round3_zero.json": (tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    "model_selection.json": (tables.model_selection, tables.model_selection_candidates),
    "search_by_lml.json": (tables.search_by_lml,),
    "search_by_lml_small.json": (tables.search_by_lml,),
}
Renderer = Callable[[dict[str, Any]], str]


def _shown(path: Path) -> str:
    """How a results file is named on a page: from the repository root (as given, outside it)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def results_path(file: str, folders: Sequence[Path]) -> Path:
    """The results file a placeholder names: a path from the repository root (``research/results/x.json``), or a
    name in the first of ``folders`` that holds it (the first folder where none does).

    >>> _shown(results_path("conversion.json", [RESULTS])), _shown(results_path("research/results/x.json", []))
    ('benchmarks/results/conversion.json', 'research/results/x.json')
    """
    if "/" in file:
        return ROOT / file
    return next((folder / file for folder in folders if (folder / file).is_file()), folders[0] / file)


def render(
    template: str,
    folders: Sequence[Path] = (RESULTS,),
    *,
    renderers: Mapping[str, Renderer] = tables.TABLES,
    name: str = TEMPLATE.name,
) -> str:
    """The template with every placeholder replaced by its provenance line and table (``renderers[NAME]``), its
    results looked up in ``folders``; ``name`` is the template's file name, for the errors."""
    out = []
    for number, line in enumerate(template.splitlines(), 1):
        match = PLACEHOLDER.match(line)
        if match is None:
            if "{{" in line:
                raise ValueError(f"{name}:{number}: malformed placeholder {line.strip()!r}")
            out.append(line)
            continue
        table, path = match["name"], results_path(match["file"], folders)
        if table not in renderers:
            raise ValueError(f"{name}:{number}: unknown table {table!r}; one of {sorted(renderers)}")
        result = load_results(path)
        block = f"_{provenance(result['meta'])} Results: `{_shown(path)}`._\n\n"
        block += renderers[table](result)
        out += [(match["indent"] + text) if text else "" for text in block.splitlines()]
    return "\n".join(out) + "\n"


def outputs(results: Path = RESULTS) -> dict[Path, str]:
    """Every generated file and its content."""
    files = {page: render(template.read_text(), [results], name=template.name) for page, template in PAGES.items()}
    for file, renderers in COMPANIONS.items():
        files[results / file.replace(".json", ".md")] = tables.results_markdown(
            load_results(results / file), *renderers
        )
    return files


def update(files: Mapping[Path, str], check: bool, command: str) -> int:
    """Write each of ``files`` whose content differs (``check``: only list them); 1 if ``check`` found any out of
    date, else 0. ``command`` is what regenerates them, for the message."""
    stale = [path for path, text in files.items() if not (path.is_file() and path.read_text() == text)]
    if check:
        if stale:
            print(f"out of date (run {command}):", *(_shown(path) for path in stale))
        return int(bool(stale))
    for path in stale:
        write_text(path, files[path])
        print(f"wrote {_shown(path)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    args = parser.parse_args(argv)
    return update(outputs(), args.check, "python -m benchmarks.report")


if __name__ == "__main__":
    sys.exit(main())
