"""The README's Python blocks run as a reader pastes them: each one alone, in a fresh namespace (issue 41: two of
them needed names only an earlier block defined). A block that loads a file gets that file in its directory, as a
reader would have it; the quick start's 400 iterations are cut to a few, unless ``-m slow``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import timm
from safetensors.torch import save_file

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
QUICK_STEPS = "steps=8, eval_every=8, eval_examples_per_chunk=32"
"""What the quick start's ``steps=400`` becomes in the default run: a few iterations, one small LML estimate (the
block as written takes minutes on 2 cores)."""


def _run_block(code: str, directory: Path, monkeypatch) -> dict:
    monkeypatch.chdir(directory)
    if "resnet18.safetensors" in code:  # "a pretrained model loads from a local file": an ImageNet-shaped one
        save_file(timm.create_model("resnet18").state_dict(), directory / "resnet18.safetensors")
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) == 3 and "fit(" in BLOCKS[0]


@pytest.mark.parametrize("index", range(1, len(BLOCKS)))
def test_each_later_readme_block_runs_on_its_own(index, tmp_path, monkeypatch):
    namespace = _run_block(BLOCKS[index], tmp_path, monkeypatch)
    assert "pmodel" in namespace


def test_the_quick_start_runs_on_its_own(tmp_path, monkeypatch):
    code = BLOCKS[0].replace("steps=400", QUICK_STEPS)
    assert code != BLOCKS[0]
    namespace = _run_block(code, tmp_path, monkeypatch)
    assert namespace["result"].steps == 8 and (tmp_path / "model.onnx").is_file()


@pytest.mark.slow
def test_the_quick_start_runs_on_its_own_as_written(tmp_path, monkeypatch):
    namespace = _run_block(BLOCKS[0], tmp_path, monkeypatch)
    assert namespace["result"].steps == 400
