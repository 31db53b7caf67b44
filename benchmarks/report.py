"""Generate docs/benchmarks.md (and the results' Markdown companions) from the JSON results.

The hand-written commentary lives in ``benchmarks/report_template.md``; each line there of the form
``{{table NAME FILE}}`` (indented or not) becomes the provenance line of ``benchmarks/results/FILE``
(date, machine, device, torch, commit from its ``meta``) and the table ``benchmarks.tables.TABLES[NAME]``
renders from it, indented as the placeholder is. So the tables never drift from the results:
``tests/test_benchmark_report.py`` checks that regenerating gives exactly the committed files.

    python -m benchmarks.report            # rewrite docs/benchmarks.md and benchmarks/results/*.md
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


def render(template: str, results: Path = RESULTS) -> str:
    """The template with every placeholder replaced by its provenance line and table."""
    out = []
    for number, line in enumerate(template.splitlines(), 1):
        match = PLACEHOLDER.match(line)
        if match is None:
            if "{{" in line:
                raise ValueError(f"{TEMPLATE.name}:{number}: malformed placeholder {line.strip()!r}")
            out.append(line)
            continue
        name, file = match["name"], match["file"]
        if name not in tables.TABLES:
            raise ValueError(f"{TEMPLATE.name}:{number}: unknown table {name!r}; one of {sorted(tables.TABLES)}")
        result = load_results(results / file)
        block = f"_{provenance(result['meta'])} Results: `benchmarks/results/{file}`._\n\n"
        block += tables.TABLES[name](result)
        out += [(match["indent"] + text) if text else "" for text in block.splitlines()]
    return "\n".join(out) + "\n"


def outputs(results: Path = RESULTS) -> dict[Path, str]:
    """Every generated file and its content."""
    files = {OUT: render(TEMPLATE.read_text(), results)}
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
