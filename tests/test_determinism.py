"""Determinism: the same seed and data give the same assignments, chunks and training trajectory in every
run and process; the options that change the trajectory are listed in the README ("Determinism")."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save
from torch import nn

from partition_fx import export_subnetwork, partitionify
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import fit, split_into_chunks
from partition_fx.transforms import ConcreteDropout, InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

# One run, as a script: it must give the same bits in a fresh interpreter with another hash seed.
RUN = """
import hashlib, json, sys
import torch
from safetensors.torch import save
from torch import nn
from partition_fx import export_subnetwork, partitionify
from partition_fx.training import fit
from partition_fx.transforms import ConcreteDropout, InputMask

def run(assignments="stored"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), ConcreteDropout(p=0.2), nn.Tanh(), nn.Linear(64, 3))
    pmodel = partitionify(model, 3, (0.5, 0.25, 0.25), seed=1, assignments=assignments)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 64, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    hyper = InputMask(64)
    result = fit(pmodel, (x, y), hyper=hyper, steps=12, batch_size=8, eval_every=4, seed=3, progress=False)
    # every subnetwork as exported (the layout buffers differ between stored and regenerated), and psi
    state = {f"{k}.{name}": v for k in range(4) for name, v in export_subnetwork(pmodel, k).state_dict().items()}
    state["mask"] = hyper.logits.detach()
    return hashlib.sha256(save(state)).hexdigest(), [r["lml"] for r in result.history]

if __name__ == "__main__":
    print(json.dumps(run()))
"""


def _in_process_run(assignments: str = "stored") -> tuple[str, list[float]]:
    namespace: dict[str, object] = {}
    exec(compile(RUN, "determinism_run", "exec"), namespace)
    return namespace["run"](assignments)  # type: ignore[operator]


def _subprocess_run(tmp_path: Path, hash_seed: str) -> tuple[str, list[float]]:
    script = tmp_path / "run.py"
    script.write_text(RUN)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    digest, lml = json.loads(out.stdout)
    return digest, lml


def test_the_same_seed_gives_the_same_bits_in_other_processes(tmp_path) -> None:
    """Definition: the run in this process. Other hash seeds change set/dict-of-str orders, not the result."""
    want = _in_process_run()
    assert _subprocess_run(tmp_path, "0") == want
    assert _subprocess_run(tmp_path, "12345") == want


def test_regenerated_layouts_train_exactly_like_stored_ones() -> None:
    """Regenerating the layout is a memory option, not a different model: same parts, same trajectory."""
    assert _in_process_run("regenerated") == _in_process_run("stored")


def test_deterministic_algorithms_mode_runs_and_changes_nothing_on_cpu() -> None:
    want = _in_process_run()
    torch.use_deterministic_algorithms(True)
    try:
        got = _in_process_run()
    finally:
        torch.use_deterministic_algorithms(False)
    assert got == want


def test_assignments_depend_on_the_seed_only() -> None:
    model = nn.Sequential(nn.Linear(40, 40), nn.LayerNorm(40), nn.Linear(40, 5))
    states = []
    for global_seed, seed in [(1, 5), (2, 5), (1, 6)]:
        torch.manual_seed(global_seed)
        pmodel = partitionify(model, 3, (0.6, 0.2, 0.2), seed=seed)
        states.append({k: v for k, v in pmodel.state_dict().items() if k.endswith("index")})
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])  # the global RNG plays no part
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_chunks_depend_on_the_seed_only() -> None:
    torch.manual_seed(1)
    a = split_into_chunks(100, (0.5, 0.25, 0.25), seed=4)
    torch.manual_seed(2)
    b = split_into_chunks(100, (0.5, 0.25, 0.25), seed=4)
    c = split_into_chunks(100, (0.5, 0.25, 0.25), seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a.indices, b.indices))
    assert not all(torch.equal(x, y) for x, y in zip(a.indices, c.indices))


def test_a_different_seed_gives_a_different_run() -> None:
    """Guards the tests above: the fingerprint they compare does see a change of seed."""
    torch.manual_seed(0)
    x, y = torch.randn(48, 6), torch.randint(0, 3, (48,))

    def digest(seed: int) -> str:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), ConcreteDropout(p=0.2), nn.Linear(8, 3))
        pmodel = partitionify(model, 2, seed=1)
        fit(pmodel, (x, y), PAPER, steps=4, batch_size=8, seed=seed, progress=False)
        return hashlib.sha256(save(export_subnetwork(pmodel).state_dict())).hexdigest()

    assert digest(0) == digest(0) != digest(1)
    assert json.dumps(InputMask(3).hyperparameters())  # plain values: the history is JSON


def test_how_often_the_lml_is_estimated_does_not_change_the_training_path() -> None:
    """The LML estimate samples augmentation and dropout noise from its own generator (torch's global one is
    forked around it), so eval_every changes only which LMLs are recorded, not the trained model or psi."""

    def run(eval_every: int) -> tuple[str, list[float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), ConcreteDropout(p=0.2), nn.Tanh(), nn.Linear(32, 3))
        pmodel = partitionify(model, 3, (0.5, 0.25, 0.25), seed=1)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(96, 16, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
        hyper = InputMask(16)
        result = fit(
            pmodel, (x, y), PAPER, hyper=hyper, steps=12, batch_size=8, eval_every=eval_every, seed=3, progress=False
        )
        state = {f"{k}.{name}": v for k in range(4) for name, v in export_subnetwork(pmodel, k).state_dict().items()}
        state["mask"] = hyper.logits.detach()
        return hashlib.sha256(save(state)).hexdigest(), [r["step"] for r in result.history]

    (every_2, steps_2), (every_6, steps_6) = run(2), run(6)
    assert steps_2 == [2, 4, 6, 8, 10, 12] and steps_6 == [6, 12]
    assert every_2 == every_6
