"""The benchmarks behind docs/benchmarks.md: what training learns with today's defaults, how that compares with
other ways of choosing hyperparameters, and what it costs. Run each from the repository root as
``python -m benchmarks.NAME``; each uses the package's public API, as a user's script would.

Every script writes its results through :mod:`benchmarks.common` in one format, and ``python -m benchmarks.report``
renders docs/benchmarks.md from them (:mod:`benchmarks.tables`). The modules the benchmarks share are
``common`` (the results format and files), ``tables``, ``arms`` (the default job's arms) and ``methods`` (the
hyperparameter methods compared). The research diagnostics live in ``research/``.
"""
