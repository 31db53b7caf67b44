"""The repository root's conftest: pytest puts this directory on ``sys.path``, so the tests import the
benchmarks as the package they are (``from benchmarks import methods``) however pytest is started."""
