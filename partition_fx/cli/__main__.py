"""``python -m partition_fx.cli``: the ``partition-fx`` command."""

from .dispatch import main

raise SystemExit(main())
