"""Generate docs/research.md and docs/history.md from the JSON results of the research diagnostics and of the
benchmarks' earlier runs.

Each page has its template: ``research/report_template.md`` (what the diagnostics found: where the hyper-gradient
points, branches of a run, starts, populations, an Occam term, the targets) and ``research/history_template.md``
(how the defaults were chosen, in the order things were tried). Their placeholders, ``{{table NAME FILE}}``, are
rendered as ``benchmarks.report.render`` renders docs/benchmarks.md: ``FILE`` is looked up in ``research/results/``,
then in ``benchmarks/results/``, and ``NAME`` in :data:`research.tables.TABLES` (the diagnostics' tables and the
benchmarks'). ``tests/test_benchmark_report.py`` checks that regenerating gives exactly the committed pages.

    python -m research.report            # rewrite docs/research.md and docs/history.md
    python -m research.report --check    # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import RESULTS as BENCHMARK_RESULTS
from benchmarks.common import ROOT
from benchmarks.report import render, update
from research import RESULTS, tables

TEMPLATE = ROOT / "research" / "report_template.md"
OUT = ROOT / "docs" / "research.md"
HISTORY_TEMPLATE = ROOT / "research" / "history_template.md"
HISTORY_OUT = ROOT / "docs" / "history.md"
PAGES = {OUT: TEMPLATE, HISTORY_OUT: HISTORY_TEMPLATE}
"""Each generated page and the template it is rendered from."""
FOLDERS = (RESULTS, BENCHMARK_RESULTS)
"""Where a placeholder's results file is looked up, in order."""


def outputs() -> dict[Path, str]:
    """Every generated page and its content."""
    return {
        page: render(template.read_text(), FOLDERS, renderers=tables.TABLES, name=template.name)
        for page, template in PAGES.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report pages that are out of date")
    args = parser.parse_args(argv)
    return update(outputs(), args.check, "python -m research.report")


if __name__ == "__main__":
    sys.exit(main())
