"""Running the Flower apps of ``partition_fx.federated.app`` from Python on Flower's simulation engine
(``flwr[simulation]``, the ``federated`` extra), as ``partition-fx federated`` does.

``flwr run examples/flower_app`` is Flower's own way to start the same apps (through a local SuperLink);
``run_flower`` runs them in this process instead (``flwr.simulation.run_simulation``: the server app in a
thread, the clients in Ray workers) and returns the finished run. Flower marks that function deprecated in
favour of ``flwr run`` and says so in its log; it is the one way Flower offers to run apps inside a Python
process, which a command that returns a report needs.
"""

from __future__ import annotations

import os
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


def run_flower(config: FederatedConfig, *, on_round: Any = None, cpus: int = 2) -> FederatedRun:
    """``config``'s run on Flower's simulation engine with ``config.clients`` SuperNodes (``cpus`` Ray CPUs,
    one per client at a time); ``on_round`` as ``make_server_app``'s. Flower's round logs go to its logger
    (``flwr``), at INFO.

    >>> run = run_flower(FederatedConfig(data="digits", image_size=8, clients=4, rounds=1, samples=1,
    ...                                  proportions=(0.5, 0.5)))  # doctest: +SKIP
    """
    flwr = import_flower()
    from .app import make_client_app, make_server_app

    finished: list[FederatedRun] = []
    server_app = make_server_app(config, on_round=on_round, on_finish=finished.append,
                                 min_available_nodes=config.clients)  # fmt: skip
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
        raise PartitionError("the Flower simulation ended without finishing the run; see Flower's log above")
    return finished[0]


__all__ = ["import_flower", "run_flower"]
