"""Generate docs/benchmarks.md and docs/history.md (and the results' Markdown companions) from the JSON results.

The hand-written commentary lives in one template per page (:data:`PAGES`): ``benchmarks/report_template.md``
for docs/benchmarks.md (the current results: what training learns with today's defaults, the comparisons, the
costs) and ``benchmarks/history_template.md`` for docs/history.md (how the defaults were chosen, in the order
things were tried). Each line of a template of the form ``{{table NAME FILE}}`` (indented or not) becomes the
provenance line of ``benchmarks/results/FILE`` (date, machine, device, torch, commit from its ``meta``) and the
table ``benchmarks.tables.TABLES[NAME]`` renders from it, indented as the placeholder is. So the tables never
drift from the results: ``tests/test_benchmark_report.py`` checks that regenerating gives exactly the committed
files, and that every results file is in one of the pages.

    python -m benchmarks.report            # rewrite docs/benchmarks.md, docs/history.md, benchmarks/results/*.md
    python -m benchmarks.report --check    # exit 1 if any of them is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks import tables
from benchmarks._common import RESULTS, ROOT, load_results, provenance
from partition_fx._io import replace_file

TEMPLATE = ROOT / "benchmarks" / "report_template.md"
OUT = ROOT / "docs" / "benchmarks.md"
HISTORY_TEMPLATE = ROOT / "benchmarks" / "history_template.md"
HISTORY_OUT = ROOT / "docs" / "history.md"
PAGES = {OUT: TEMPLATE, HISTORY_OUT: HISTORY_TEMPLATE}
"""Each generated page and the template it is rendered from."""
PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)\{\{table (?P<name>\w+) (?P<file>[\w.-]+\.json)\}\}$")
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


def render(template: str, results: Path = RESULTS, *, name: str = TEMPLATE.name) -> str:
    """The template with every placeholder replaced by its provenance line and table; ``name`` is the template's
    file name, for the errors."""
    out = []
    for number, line in enumerate(template.splitlines(), 1):
        match = PLACEHOLDER.match(line)
        if match is None:
            if "{{" in line:
                raise ValueError(f"{name}:{number}: malformed placeholder {line.strip()!r}")
            out.append(line)
            continue
        table, file = match["name"], match["file"]
        if table not in tables.TABLES:
            raise ValueError(f"{name}:{number}: unknown table {table!r}; one of {sorted(tables.TABLES)}")
        result = load_results(results / file)
        block = f"_{provenance(result['meta'])} Results: `benchmarks/results/{file}`._\n\n"
        block += tables.TABLES[table](result)
        out += [(match["indent"] + text) if text else "" for text in block.splitlines()]
    return "\n".join(out) + "\n"


def outputs(results: Path = RESULTS) -> dict[Path, str]:
    """Every generated file and its content."""
    files = {page: render(template.read_text(), results, name=template.name) for page, template in PAGES.items()}
    for file, renderers in COMPANIONS.items():
        files[results / file.replace(".json", ".md")] = tables.results_markdown(
            load_results(results / file), *renderers
        )
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            replace_file(path, lambda tmp, text=text: tmp.write_text(text))
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print("out of date (run python -m benchmarks.report):", *(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
