"""Golden outputs of the training layer and the command line: ``generate`` runs small fixed-seed jobs and writes
what they return under ``data/``; ``tests/test_golden.py`` runs them again and compares."""
