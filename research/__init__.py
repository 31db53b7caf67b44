"""Research diagnostics: questions about the method that the package's defaults were settled by, kept apart from
the benchmarks users read (``benchmarks/``), as torchvision keeps its ``references/`` outside its package.

Run each from the repository root as ``python -m research.NAME`` (``--quick`` for a smoke run that writes
nothing). ``research/README.md`` indexes them: each one's question, its answer, its results file and whether it is
concluded or open. Results go to ``research/results/`` in the benchmarks' one format (``benchmarks.common``), and
``python -m research.report`` renders docs/research.md and docs/history.md from them. Research builds on the
package's public API and on the benchmarks' shared modules (``benchmarks.common``, ``benchmarks.arms``,
``benchmarks.tables``, ``benchmarks.methods``); no benchmark imports research.
"""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""Where the diagnostics write their results (``research/results/``)."""
