"""The benchmarks behind docs/benchmarks.md and docs/history.md: run each from the repository root as
``python -m benchmarks.NAME``.

Every script writes its results through :mod:`benchmarks._common` in one format, and
``python -m benchmarks.report`` renders docs/benchmarks.md and docs/history.md from them (:mod:`benchmarks.tables`).
"""
