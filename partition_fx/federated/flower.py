"""Running the Flower apps of ``partition_fx.federated.app`` from Python on Flower's simulation engine
(``flwr[simulation]``, the ``federated`` extra), as ``partition-fx federated`` does.

``flwr run examples/flower_app`` is Flower's own way to start the same apps (through a local SuperLink);
``run_flower`` runs them in this process instead (``flwr.simulation.run_simulation``: the server app in a
thread, the clients in Ray workers) and returns the finished run. Flower marks that function deprecated in
favour of ``flwr run`` and says so in its log; it is the one way Flower offers to run apps inside a Python
process, which a command that returns a report needs.

Flower logs through the Python logger ``flwr``, to a console handler of its own (coloured, on the stderr it found
when imported). ``run_flower`` keeps that log to warnings and errors while it runs (:func:`flower_logging`): the
round log at INFO and the deprecation notice about ``run_simulation``, which is this module's to act on, not its
caller's, would otherwise be most of a run's output.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import PartitionError
from ..extras import import_extra
from .config import FederatedConfig
from .job import FederatedRun


def import_flower() -> Any:
    """Import Flower, or say how to install it (no telemetry from a simulation)."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read at import: no network calls from a simulation
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    flwr = import_extra("federated training", "flwr")  # one line naming the install, if Flower is missing
    import_extra("federated training", "flwr.simulation")

    return flwr


FLOWER_LOG_LEVEL = "FLWR_LOG_LEVEL"
"""Flower's own setting of its console log's level (read when ``flwr`` is imported): when it is set, runs show
Flower's log as Flower configured it."""
_FLOWERS_OWN_NOTICES = ("DEPRECATED FEATURE", "FEATURE UPDATE")
"""How Flower's notices about its own API begin (``flwr.common.logger.warn_deprecated_feature``)."""


def _not_flowers_own_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).lstrip().startswith(_FLOWERS_OWN_NOTICES)


@contextmanager
def flower_logging(show: bool | None = None) -> Iterator[None]:
    """While the block runs, Flower's log (the ``flwr`` logger) as a run shows it, restored after.

    ``show`` False: warnings and errors only (a client's failure, a round without replies), without Flower's
    notices that a function of its own is deprecated; True: Flower's log as it is configured (its round log at
    INFO); None: True when ``FLWR_LOG_LEVEL`` is set (Flower's own setting), else False. Either way Flower's
    console handler writes no colour codes unless its stream is a terminal.

    >>> flower = logging.getLogger("flwr")
    >>> before = flower.level
    >>> with flower_logging(False):
    ...     logging.getLevelName(flower.level)
    'WARNING'
    >>> flower.level == before
    True
    """
    from flwr.common.logger import ConsoleHandler

    flower = logging.getLogger("flwr")
    if show is None:
        show = bool(os.environ.get(FLOWER_LOG_LEVEL))
    level = flower.level
    consoles = [h for h in flower.handlers if isinstance(h, ConsoleHandler)]
    colored = [h.colored for h in consoles]
    for handler in consoles:
        handler.colored = handler.colored and _is_terminal(handler.stream)
    if not show:
        flower.setLevel(logging.WARNING)
        flower.addFilter(_not_flowers_own_notice)
    try:
        yield
    finally:
        flower.removeFilter(_not_flowers_own_notice)
        flower.setLevel(level)
        for handler, was in zip(consoles, colored):
            handler.colored = was


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def run_flower(
    config: FederatedConfig, *, on_round: Any = None, cpus: int = 2, flower_log: bool | None = None
) -> FederatedRun:
    """``config``'s run on Flower's simulation engine with ``config.clients`` SuperNodes (``cpus`` Ray CPUs,
    one per client at a time); ``on_round`` as ``make_server_app``'s (a way to follow the rounds).

    Flower's log (the ``flwr`` logger) shows only warnings and errors while the run lasts, as
    ``flower_logging(flower_log)`` keeps it: to see Flower's round log, pass ``flower_log=True`` or set
    ``FLWR_LOG_LEVEL=INFO`` (setting the ``flwr`` logger's level beforehand does not last through the run). Ray
    is started without its dashboard, at ERROR, and without the workers' output.

    >>> run = run_flower(FederatedConfig(data="digits", image_size=8, clients=4, rounds=1, samples=1,
    ...                                  proportions=(0.5, 0.5)))  # doctest: +SKIP
    """
    flwr = import_flower()
    from .app import make_client_app, make_server_app

    finished: list[FederatedRun] = []
    server_app = make_server_app(config, on_round=on_round, on_finish=finished.append,
                                 min_available_nodes=config.clients)  # fmt: skip
    with flower_logging(flower_log):
        flwr.simulation.run_simulation(
            server_app=server_app,
            client_app=make_client_app(config),
            num_supernodes=config.clients,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False, "logging_level": "ERROR",
                              "log_to_driver": False},
            },
        )  # fmt: skip
    if not finished:
        raise PartitionError("the Flower simulation ended without finishing the run; see Flower's warnings above")
    return finished[0]


__all__ = ["FLOWER_LOG_LEVEL", "flower_logging", "import_flower", "run_flower"]
