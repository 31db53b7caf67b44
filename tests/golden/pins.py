"""Pins for a change that must compute nothing new: a hash of each of the examples' quick runs (own loop, Lightning
fit), the batch sampler's draws, a short federated simulation with its final state, and every command's ``--help``.

Run it before and after a refactor on one machine and compare the two outputs (wall-clock fields are left out);
with ``python -m tests.golden.generate`` (the golden jobs) it is the proof that a layout change changed nothing::

    python -m tests.golden.pins > before.json   # on the code before
    python -m tests.golden.pins > after.json    # on the code after
    diff before.json after.json
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded (as in the tests' conftest)

WALL_CLOCK = ("seconds", "seconds_per_round", "wall_seconds", "time")
"""Fields that differ between runs of the same computation, left out of every hash."""


def digest(value: Any) -> str:
    """A short sha256 of ``value`` as plain data: tensors by their bytes, mappings without :data:`WALL_CLOCK`."""
    import torch

    def plain(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items() if k not in WALL_CLOCK}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)

    return hashlib.sha256(json.dumps(plain(value), sort_keys=True, default=str).encode()).hexdigest()[:16]


def pins() -> dict[str, str]:
    """Every pin's hash, by name (one thread)."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    found: dict[str, str] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        import own_loop

        found["own_loop"] = digest(own_loop.main(["--quick"]))
    found["own_loop_stdout"] = digest(out.getvalue())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import lightning_fit

        found["lightning_fit"] = digest(lightning_fit.main(["--quick"]))
    from partition_fx.training import PartitionedBatchSampler, TrainConfig, split_into_chunks

    config = TrainConfig.recommended(steps=50, batch_size=16, seed=3)
    sampler = PartitionedBatchSampler(split_into_chunks(500, (0.7, 0.2, 0.1), seed=3), config)
    draws = [repr(d) for d in itertools.islice(sampler.draws(), 50)]
    found["sampler"] = digest([draws, list(itertools.islice(iter(sampler), 50))])
    from partition_fx.federated import FederatedConfig, simulate

    run = simulate(FederatedConfig(data="digits", image_size=8, clients=6, rounds=6, samples=1, evaluate_every=2))
    found["federated"] = digest(run.history())
    found["federated_state"] = digest(dict(run.model.pmodel.state_dict()))
    from partition_fx.cli import main as cli_main

    for command in ["", "train", "export", "convert", "predict", "describe", "federated"]:
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
            cli_main([*([command] if command else []), "--help"])
        found[f"help_{command or 'main'}"] = digest(text.getvalue())
    return found


if __name__ == "__main__":
    print(json.dumps(pins(), indent=1))
