"""The examples run end to end (their --quick mode: tiny budgets, same code paths)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str, folder: Path = EXAMPLES):
    """A script under examples/ as a module, to call its ``main``."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _benchmark(name: str):
    """``benchmarks.NAME`` (run as ``python -m benchmarks.NAME``), to call its ``main``."""
    return importlib.import_module(f"benchmarks.{name}")


def _research(name: str):
    """``research.NAME`` (run as ``python -m research.NAME``), to call its ``main``."""
    return importlib.import_module(f"research.{name}")


def test_rotation_invariance_example(capsys):
    results = _load("rotation_invariance").main(["--quick"])
    assert [(r["dataset"], r["augment"]) for r in results] == [
        ("rotdigits", True),
        ("rotdigits", False),
        ("digits", True),
    ]
    assert all(0.0 <= r["test_accuracy"] <= 1.0 and r["lml"] < 0 for r in results)
    assert "rotation range" in capsys.readouterr().out


def test_input_selection_example(capsys):
    found = _load("input_selection").main(["--quick"])
    assert len(found["candidates"]) == 8 and found["informative"] == [0, 1, 2]
    assert len(found["mask"]) == 8 and "highest conditional LML" in capsys.readouterr().out


def test_finetune_pretrained_example(tmp_path, capsys):
    found = _load("finetune_pretrained").main(["--quick", "--out", str(tmp_path)])
    assert Path(found["onnx"]).is_file() and (tmp_path / "pretrained.safetensors").is_file()
    assert "verified in onnxruntime" in capsys.readouterr().out


def test_hf_vit_folder_example_quick(tmp_path, capsys):
    pytest.importorskip("transformers")
    found = _load("hf_vit_folder").main(["--quick", "--out", str(tmp_path)])
    assert (Path(found["folder"]) / "config.json").is_file()
    assert found["test_accuracy"] == pytest.approx(found["reported"])
    assert "from_pretrained(" in capsys.readouterr().out


def test_own_loop_example(capsys):
    found = _load("own_loop").main(["--quick"])
    assert type(found["model"]).__name__ == "SmallCNN" and 0.0 <= found["test_accuracy"] <= 1.0
    assert "rotation" in found["hyperparameters"] and "conditional" in capsys.readouterr().out


def test_lightning_fit_example(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lightning", reason="the lightning extra: pip install 'partition-fx[lightning]'")
    found = _load("lightning_fit").main(["--quick", "--out", str(tmp_path / "out")])
    assert 0.0 <= found["test_accuracy"] <= 1.0 and "rotation" in found["hyperparameters"]
    assert "conditional_lml" in found["metrics"].read_text() and "test accuracy" in capsys.readouterr().out
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # without --out: nothing is left behind
    assert _load("lightning_fit").main(["--quick"])["metrics"] is None
    assert not any((tmp_path / "tmp").iterdir())


def test_optuna_search_example(capsys):
    found = _load("optuna_search").main(["--quick"])
    assert found["trials"] == 3 and sorted(found["best_params"]) == ["lr", "weight_decay", "width"]
    assert 0.0 <= found["test_accuracy"] <= 1.0 and "best conditional LML" in capsys.readouterr().out


def test_search_by_lml_benchmark_quick(capsys):
    result = _benchmark("search_by_lml").main(["--quick", "--seeds", "0"])
    assert [r["arm"] for r in result["rows"]] == ["lml", "validation", "default"]
    assert all(len(r["trials"]) == 3 for r in result["rows"][:2])
    assert "| lml |" in capsys.readouterr().out


def test_detection_zoom_example_quick(capsys):
    found = _load("detection_zoom").main(["--quick"])
    assert found["untraced"] and found["exported"] == "FasterRCNN"
    assert 0 <= found["zoom"] <= 0.7 and found["zoom"] != 0.2  # learned, within its bound (log 2)
    assert "learned zoom range" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name",
    [
        "rotation_invariance",
        "input_selection",
        "finetune_pretrained",
        "hf_vit_folder",
        "own_loop",
        "detection_zoom",
        "lightning_fit",
        "optuna_search",
    ],
)
def test_examples_document_how_to_run_them(name):
    text = (EXAMPLES / f"{name}.py").read_text()
    assert f"python examples/{name}.py" in text and "--quick" in text


def test_learned_augmentation_benchmark_quick(tmp_path, capsys):
    module = _benchmark("learned_augmentation")
    result = module.main(["--quick", "--seeds", "0", "--runs", str(tmp_path)])
    assert [(r["data"], r["augment"]) for r in result["rows"]] == module.CONFIGS
    out = capsys.readouterr().out
    assert "| rotdigits | learned affine |" in out and "| rotdigits | oracle: rotation fixed at pi, C=1 |" in out
    (oracle,) = [r for r in result["rows"] if r["augment"] == "oracle"]
    assert oracle["rotation"] == [float(np.float32(3.1416))] and oracle["other_ranges_max"] == [0.0]
    (learned,) = [r for r in result["rows"] if r["data"] == "rotdigits" and r["augment"] == "affine"]
    (trajectory,) = learned["ranges_trajectories"]  # every range at each evaluation, the last one the learned
    assert trajectory[-1][1] == learned["ranges"][0] and {"rotation", "scale_x"} <= trajectory[0][1].keys()
    assert all(ranges == oracle["ranges"][0] for _, ranges in oracle["ranges_trajectories"][0])  # fixed throughout
    # a second call reuses the completed runs
    assert module.main(["--quick", "--seeds", "0", "--runs", str(tmp_path)])["rows"] == result["rows"]
    # but not one whose ranges started elsewhere (as an earlier default start would have): it is trained again
    path = tmp_path / "rotdigits_affine_s0" / "report.json"
    report = json.loads(path.read_text())
    wide = float(np.float32(math.pi))  # the default start (AffineAugmentation's WIDE_START)
    assert report["initial_hyperparameters"]["rotation"] == wide
    path.write_text(
        json.dumps(report | {"initial_hyperparameters": {**report["initial_hyperparameters"], "rotation": 1.5}})
    )
    module.main(["--quick", "--seeds", "0", "--runs", str(tmp_path)])
    assert json.loads(path.read_text())["initial_hyperparameters"]["rotation"] == wide


def test_fedadams_grid_widens_past_a_winning_edge_until_its_choice_is_interior(monkeypatch, tmp_path):
    """Definition: the grid grows by its own outer ratio past the edge that wins on validation, until the best
    rate has a worse neighbour on each side (here the optimum 0.02 from {1e-3, 3e-3}: 9e-3, 0.027, 0.081)."""
    import argparse

    from partition_fx.federated import FederatedConfig

    module = _benchmark("federated")
    scored = []

    def fake_run(config, scratch):
        scored.append(config.server_lr)
        accuracy = 1 - abs(math.log(config.server_lr / 0.02))
        return {"rounds": 4, "curve": [{"round": 4, "validation-accuracy-averaged": accuracy}]}

    monkeypatch.setattr(module, "cached_run", fake_run)
    args = argparse.Namespace(server_lrs=[0.001, 0.003], scratch=tmp_path)
    lr, grid = module.tuned_fedadam(FederatedConfig(rounds=4), args)
    assert scored == [0.001, 0.003, 0.009, 0.027, 0.081] and lr == 0.027 and list(grid) == sorted(scored)


def test_federated_budget_sweep_quick(tmp_path, capsys):
    """--budgets: per data set, seed and rounds the partitioned run, the model the command hands back (the
    baseline's when psi learned nothing, as at 4 rounds) and FedAdam tuned at the same rounds; the table."""
    from benchmarks import tables

    module = _benchmark("federated")
    argv = ["--budgets", "4", "--clients", "6", "--seeds", "0", "--data", "digits", "--server-lrs", "0.003,0.01",
            "--scratch", str(tmp_path / "runs"), "--out", str(tmp_path / "budgets.json")]  # fmt: skip
    module.main(argv)
    result = json.loads((tmp_path / "budgets.json").read_text())
    (run,) = result["runs"]
    assert run["rounds"] == 4 and run["warmup"]["started_at"] is None and "psi learned nothing" in run["warmup"]["note"]
    assert run["handed_back"]["hyperparameters"]["rotation"] == 0.0  # the baseline's model
    assert run["difference"] == pytest.approx(100 * (run["handed_back"]["test"] - run["fedadam"]["test"]))
    assert "| digits | 4 | 1 |" in tables.federated_budgets(result) and "1 of 1" in tables.federated_budgets(result)
    module.main([("2" if a == "4" else a) for a in argv])  # another budget: the 4 rounds' row is kept beside it
    kept = json.loads((tmp_path / "budgets.json").read_text())
    assert [(r["rounds"], r["seed"]) for r in kept["runs"]] == [(2, 0), (4, 0)] and kept["runs"][1] == run


def test_federated_benchmark_quick(tmp_path, capsys):
    """Both data sets, every arm chosen on validation (the FedAdam rate, the FedEx rotation), the lessons, the
    paper's cost, the tables; a second call reuses every cached run, a third (its cache gone) what the results
    file holds."""
    from benchmarks import tables

    module = _benchmark("federated")
    argv = ["--quick", "--lessons", "--paper-cost", "--server-lrs", "0.001,0.003", "--scratch",
            str(tmp_path / "runs"), "--out", str(tmp_path / "federated.json")]  # fmt: skip
    rows = module.main(argv)
    assert [r["data"] for r in rows] == ["rotdigits", "digits"] and all(r["seeds"] == [0] for r in rows)
    result = json.loads((tmp_path / "federated.json").read_text())
    for run in result["runs"]:
        grid = run["server_lr_grid"]
        assert float(max(grid, key=lambda rate: grid[rate])) == run["server_lr"]  # the validation's best
        rates = sorted(map(float, grid))  # the grid given, widened past a winning edge until its choice is interior
        assert {0.001, 0.003} <= set(rates)
        assert 0 < rates.index(run["server_lr"]) < len(rates) - 1 or len(rates) == 2 + module.MAX_WIDENINGS
        oracle = run["oracle_server_lr_grid"]  # the augmented arms' own rate, chosen the same way for the oracle
        assert float(max(oracle, key=lambda rate: oracle[rate])) == run["augmented_server_lr"]
        assert run["fedadam"]["rounds"] == 4 * len(grid) and run["fedex"]["rounds"] == 16
        assert run["fedex-equal"]["rounds"] == 4
        assert run["oracle"]["rounds"] == run["partitioned"]["rounds"] == 4
        assert 0 < run["partitioned"]["run_bytes"] < run["fedadam"]["run_bytes"]
    assert "| rotdigits | 1 |" in tables.federated(result) and "| digits | 0 |" in tables.federated_seeds(result)
    assert "no fine-tuning" in tables.federated_lessons(result) and (tmp_path / "federated.png").is_file()
    cost = result["summary"]["paper_cost"]  # appendix J's 2000 rounds, costed from 5 timed
    assert cost["rounds"] == 2000 and cost["fedadam"]["hours"] == pytest.approx(
        cost["fedadam"]["seconds_per_round"] * 2000 / 3600
    )
    assert cost["partitioned"]["bytes_per_round"] < cost["fedadam"]["bytes_per_round"]
    assert "| partitioned |" in tables.federated_paper_cost(result)
    capsys.readouterr()
    again = module.main(argv)
    assert [r["partitioned"] for r in again] == [r["partitioned"] for r in rows]
    assert "validation" not in capsys.readouterr().out  # nothing trained again
    shutil.rmtree(tmp_path / "runs")
    kept = module.main([*(a for a in argv if a != "--paper-cost"), "--keep-summary"])
    assert [r["partitioned"] for r in kept] == [r["partitioned"] for r in rows]
    assert "validation" not in capsys.readouterr().out  # every seed and lesson kept from the results file
    written = json.loads((tmp_path / "federated.json").read_text())
    assert all(run["commit"] for run in written["runs"])
    assert written["summary"]["paper_cost"] == cost  # not measured by this call: kept, with its commit


def test_federated_lessons_table_pairs_each_lesson_with_its_seeds_defaults(capsys):
    """Each lesson's difference is to the defaults' run of its own seed; a lesson on several seeds gets the mean
    ± SE of those paired differences. An unknown lesson to repeat is refused before anything runs."""
    from benchmarks import tables

    def lesson(seed, defaults, warmup):
        return {"data": "digits", "seed": seed, "runs": {
            "defaults": {"test": defaults, "validation": 0.9, "rotation": 0.1},
            "no psi warm-up": {"test": warmup, "validation": 0.9, "rotation": 0.1}}}  # fmt: skip

    table = tables.federated_lessons({"summary": {"lessons": [lesson(0, 0.95, 0.96), lesson(1, 0.90, 0.88)]}})
    assert "| digits | 0 | no psi warm-up | 0.960 | +1.0 |" in table
    assert "| digits | 1 | no psi warm-up | 0.880 | -2.0 |" in table
    assert "| digits | 2 seeds | no psi warm-up |  | -0.5 ± 1.5 |" in table  # mean of +1, -2; sd 2.12 / sqrt 2
    with pytest.raises(SystemExit):
        _benchmark("federated").main(["--quick", "--lessons", "--repeat-lessons", "no warmup"])
    assert "unknown ['no warmup']" in capsys.readouterr().err


@pytest.mark.slow  # about a minute and a half: 3 variants of 2 runs, and the seed's 11 runs
def test_federated_benchmark_variants_quick(tmp_path):
    """Other data and federations: the partitioned run and FedAdam on each, in the results and their table."""
    from benchmarks import tables

    module = _benchmark("federated")
    module.main(["--quick", "--variants", "--data", "rotdigits", "--server-lrs", "0.003", "--scratch",
                 str(tmp_path / "runs"), "--out", str(tmp_path / "federated.json")])  # fmt: skip
    result = json.loads((tmp_path / "federated.json").read_text())
    variants = result["summary"]["variants"]
    assert [v["data"] for v in variants] == ["scaledigits", "rotdigits", "rotdigits"]
    assert all(0 < v["partitioned"]["bytes"] < v["fedadam"]["bytes"] for v in variants)
    assert "| 100 clients, a fifth per round | rotdigits | 0 |" in tables.federated_variants(result)


def test_step_time_benchmark_quick(capsys):
    module = _benchmark("step_time")
    result = module.main(["--quick", "--schemes", "node", "--defaults", "zero"])
    (row,) = result["rows"]
    assert row["scheme"] == "node" and all(
        row[k] > 0 for k in ("parameter_step", "hyper_step", "fused_iteration_vs_plain_double_batch")
    )
    assert "| fixup_resnet14 | node | zero |" in capsys.readouterr().out


def test_memory_benchmark_quick(capsys):
    module = _benchmark("memory")
    rows = module.main(["--quick"])["rows"]
    by = {r["default"]: r["overhead_of_parameter_memory"] for r in rows}
    # stored defaults and int32 indices cost a copy of the parameters each; seed-regenerated ones nearly nothing
    assert by["init"]["defaults"] == pytest.approx(1.0, abs=0.01)
    assert by["init"]["indices_and_seeds"] == pytest.approx(1.0, abs=0.01)
    assert by["seed"]["defaults"] < 0.001 and by["seed"]["total"] < 0.02  # product/sum scales keep theirs
    assert "| fixup_resnet8 | random | seed | regenerated |" in capsys.readouterr().out


def test_convergence_benchmark_quick(capsys):
    module = _benchmark("convergence")
    result = module.main(["--quick", "--seeds", "0", "--variants", ",".join(module.VARIANTS)])
    assert [r["variant"] for r in result["rows"]] == list(module.VARIANTS)
    for r in result["runs"]:
        assert [p["step"] for p in r["curve"]] == [2, 4] and 0.0 <= r["final_test_accuracy"] <= 1.0
    (paper,) = (r for r in result["runs"] if r["variant"] == "paper")
    (plain,) = (r for r in result["runs"] if r["variant"] == "plain")
    # (c) trains with the augmentation (a) learned, frozen
    assert plain["hyperparameters"] == pytest.approx(paper["hyperparameters"])
    assert "| (c) plain, learned augmentation fixed |" in capsys.readouterr().out


def test_hyperparameter_methods_benchmark_quick(tmp_path, capsys):
    module = _benchmark("hyperparameter_methods")
    argv = [
        "--quick",
        "--seeds",
        "0",
        "--runs",
        str(tmp_path),
        "--pairs",
        "rotdigits:test_resnet,scattered:test_resnet",
    ]
    result = module.main(argv)
    methods = [*module.LEARNING, "optuna", *module.RETRAINED]
    assert [(r["task"], r["method"]) for r in result["rows"]] == [
        (t, m) for t in ("rotdigits", "scattered") for m in methods
    ]
    rows = {(r["task"], r["method"]): r for r in result["rows"]}
    for row in result["rows"]:
        assert 0.0 <= row["test_accuracy"][0] <= 1.0 and row["passes"][0]["forward"] > 0
    # fixed augmentations stay fixed; retraining uses what the learning runs found
    assert rows["rotdigits", "hand_chosen"]["hyperparameters"][0]["rotation"] == pytest.approx(3.14159, abs=1e-4)
    found = rows["rotdigits", "partitioned"]["hyperparameters"][0]
    assert rows["rotdigits", "retrain_partitioned"]["hyperparameters"][0] == pytest.approx(found)
    assert len(rows["scattered", "optuna"]["trials"]) == 2
    assert rows["rotdigits", "plain"]["passes"][0]["backward"] == 4  # one backward per iteration
    # test-time averaging: every range 0 (plain) averages identity transforms, the model's own prediction
    assert rows["rotdigits", "plain"]["averaged_test_accuracy"] == rows["rotdigits", "plain"]["test_accuracy"]
    assert all(0.0 <= row["averaged_test_accuracy"][0] <= 1.0 for row in result["rows"])
    assert result["config"]["true_invariances"]["scattered"]["translation_x"] == pytest.approx(0.4)
    assert (tmp_path / "hyperparameter_methods_rotation.png").is_file()
    assert "| rotdigits / test_resnet | 3 partitioned (paper scheme) |" in capsys.readouterr().out
    # a second call reuses every cached run
    assert module.main(argv)["rows"] == result["rows"]
    subset = module.main([*argv, "--methods", "retrain_partitioned,plain,partitioned"])["rows"]
    assert [r["method"] for r in subset] == ["plain", "partitioned", "retrain_partitioned"] * 2
    assert subset[0] == rows["rotdigits", "plain"]
    with pytest.raises(SystemExit):
        module.main([*argv, "--methods", "retrain_optuna"])  # needs optuna


def test_model_selection_benchmark_quick(capsys):
    result = _benchmark("model_selection").main(["--quick", "--seeds", "0"])
    (run,) = result["rows"]
    assert [c["inputs"] for c in run["candidates"]] == [[0], [0, 1], [0, 1, 2]]
    assert all(c["laplace_lml"] < 0 and c["partitioned_passes"]["backward"] > 0 for c in run["candidates"])
    assert run["partitioned_choice"] in [c["inputs"] for c in run["candidates"]] and len(run["mask"]) == 3
    assert "Laplace picks it" in capsys.readouterr().out


def test_hyper_estimators_benchmark_quick(tmp_path, capsys):
    """Every variant builds and trains (worker processes); the table has one line per variant."""
    module = _research("hyper_estimators")
    variants = ["paper", "all_s16_b16_every2_ft25", "digits_all_s16_b16_every2_lr1_ft25", "plain_oracle"]
    argv = ["--quick", "--seeds", "0", "--steps", "4", "--workers", "2", "--scratch", str(tmp_path)]
    result = module.main([*argv, "--variants", ",".join(variants)])
    assert [line["variant"] for line in result["summary"]] == variants
    by = {row["variant"]: row for row in result["rows"]}
    assert by["all_s16_b16_every2_ft25"]["finetune_steps"] == 1 and by["paper"]["finetune_steps"] == 0
    assert by["plain_oracle"]["hyperparameters"]["rotation"] == pytest.approx(3.14159265, abs=1e-6)  # fixed
    assert by["digits_all_s16_b16_every2_lr1_ft25"]["data"] == "digits"
    assert "| paper | 4 |" in capsys.readouterr().out


def test_hyper_gradient_variance_benchmark_quick(capsys):
    module = _research("hyper_gradient_variance")
    result = module.main(["--quick", "--at", "2", "--draws", "3"])
    assert [r["estimator"] for r in result["rows"]] == list(module.ESTIMATORS)
    assert all(len(r["draws"]) == 3 and r["sd"] >= 0 for r in result["rows"])
    assert "| fixed_batch |" in capsys.readouterr().out


def test_model_coverage_benchmark_quick(capsys):
    result = _benchmark("model_coverage").main(["--quick", "--families", "optical_flow", "segmentation"])
    assert [(r["family"], r["path"], r["passed"]) for r in result["rows"]] == [
        ("optical_flow", "untraced", True),
        ("segmentation", "traced", True),
    ]
    assert [line["family"] for line in result["summary"]["families"]] == ["segmentation", "optical_flow"]
    assert "raft_large" in capsys.readouterr().out


def test_hyper_gradient_direction_benchmark_quick(capsys):
    (row,) = _research("hyper_gradient_direction").main(["--quick"])["rows"]
    assert row["data"] == "rotdigits" and {"fixed", "implicit_0", "implicit_1"} <= row.keys()
    assert row["implicit_0"] != row["fixed"]  # the term through training is there
    assert "rotdigits r=0.50 seed 0" in capsys.readouterr().out


def test_federated_psi_quick(tmp_path, capsys):
    """Each data set at each psi rate, one seed: its rotation checked against the data set's target, each run
    cached as the benchmark's."""
    rows = _research("federated_psi").main(["--quick", "--scratch", str(tmp_path)])
    assert [(r["data"], r["rate"], r["runs"]) for r in rows] == [
        ("rotdigits", "default (0.03)", 1), ("rotdigits", "0.06", 1),
        ("digits", "default (0.03)", 1), ("digits", "0.06", 1)]  # fmt: skip
    assert all(r["meets"] == (r["rotations"][0] >= 2.5 if r["data"] == "rotdigits" else r["rotations"][0] <= 0.3)
               for r in rows)  # fmt: skip
    assert "digits psi lr 0.06: rotation" in capsys.readouterr().out
    assert len(list(tmp_path.glob("*.json"))) == 4  # one cached run per data set and rate
    # over 4 rounds the default rate is 0.06 as well: a rate given equals the same rate by default, bit for bit
    assert rows[0]["rotations"] == rows[1]["rotations"] and rows[2]["rotations"] == rows[3]["rotations"]


def test_branch_check_benchmark_quick(capsys):
    result = _research("branch_check").main(["--quick"])
    rows = result["rows"]
    assert [r["repeat"] for r in rows] == [0, 1] and {"total", "through", "direct", "fixed", "implicit_0"} <= rows[
        0
    ].keys()
    for r in rows:  # the three branches' scores, each secant read from them
        scores = r["scores"]
        assert set(scores) == {"+0+0", "+0-1", "+0+1", "-1+0", "-1-1", "+1+0", "+1+1"}
        assert math.isclose(r["total"] * (math.exp(0.4) - math.exp(-0.4)) * 0.5, scores["+1+1"] - scores["-1-1"])
    (line,) = result["summary"]["derivatives"]
    assert line["n"] == 2 and math.isclose(line["total"]["mean"], (rows[0]["total"] + rows[1]["total"]) / 2)
    assert "rotdigits rotation r=0.50 seed 0 repeat 1" in capsys.readouterr().out
    from research import tables

    assert "branches: through training" in tables.TABLES["branch_check"](result)


def test_implicit_cost_benchmark_quick(capsys):
    rows = _research("implicit_cost").main(["--quick"])["rows"]
    assert [r["step"] for r in rows] == [
        "parameter step",
        "hyper step, fixed weights",
        "hyper step, through training K=0",
        "hyper step, through training K=1",
    ]
    assert all(r["seconds"] > 0 for r in rows) and rows[0]["parameter_steps"] == 1.0
    assert "in parameter steps" in capsys.readouterr().out


def test_input_pipeline_benchmark_quick(capsys):
    module = _benchmark("input_pipeline")
    rows = module.main(["--quick"])["rows"]
    pipeline = [r for r in rows if r["arm"] == "pipeline"]
    assert [r["workers"] for r in pipeline] == [0, 1, 2] and all(r["images_per_second"] > 0 for r in pipeline)
    assert all(r["read_ahead_batches"] > 0 for r in pipeline if r["workers"] > 0)  # the plan matched the steps
    assert "images/s delivered" in capsys.readouterr().out


@pytest.mark.parametrize(("example", "extra"), [("lightning_fit", "lightning"), ("optuna_search", "optuna")])
def test_an_example_whose_extra_is_missing_says_how_to_install_it_in_one_line(example, extra):
    script = str(EXAMPLES / f"{example}.py")
    blocked = f"import sys, runpy; sys.modules[{extra!r}] = None; runpy.run_path({script!r}, run_name='__main__')"
    ran = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.strip() == (
        f"{example}.py: partition_fx.integrations.{extra} needs {extra}, which is not installed: "
        f"pip install 'partition-fx[{extra}]'"
    )


@pytest.mark.parametrize("extra", ["lightning", "optuna"])
def test_an_integration_whose_extra_is_missing_raises_the_package_s_one_line_error(extra, monkeypatch):
    from partition_fx.errors import PartitionDependencyError

    monkeypatch.setitem(sys.modules, extra, None)
    monkeypatch.delitem(sys.modules, f"partition_fx.integrations.{extra}", raising=False)
    with pytest.raises(PartitionDependencyError) as missing:
        importlib.import_module(f"partition_fx.integrations.{extra}")
    assert isinstance(missing.value, ModuleNotFoundError) and str(missing.value).endswith(
        f"pip install 'partition-fx[{extra}]'"
    )
    monkeypatch.delitem(sys.modules, f"partition_fx.integrations.{extra}", raising=False)


def test_population_benchmark_quick(capsys):
    result = _research("population").main(["--quick"])
    (row,) = result["rows"]
    assert [entry["step"] for entry in row["rounds"]] == [2, 4, 6] and row["members"] == 3
    for entry in row["rounds"]:
        for source, target in entry["copies"]:  # the worse copies the better
            assert entry["fitness"][source] > entry["fitness"][target]
    assert row["rounds"][-1]["copies"] == []  # the last round chooses the member that fine-tunes
    assert row["conditional_lml"] == max(row["rounds"][-1]["fitness"])
    assert 0 <= row["test_accuracy"] <= 1 and row["training_images"] > row["plain_training_images"]
    assert "rotdigits:zero seed 0 step 6" in capsys.readouterr().out
    from research import tables

    assert "".join(map(str, row["ancestry"])) in tables.TABLES["population"](result)
    last = row["rounds"][-1]["fitness"]
    assert len(row["ancestry"]) == 3 and last[row["ancestry"][-1]] == max(last)
    json.dumps(result)  # as it is written


def test_last_layer_evidence_is_the_laplace_evidence_of_the_exact_hessian_for_repeated_examples():
    """For copies of one example the Kronecker factors are exact: the Hessian of a linear softmax classifier's NLL
    in its weights (its GGN: the model is linear in them) is N Lambda (x) phi phi^T. The evidence then equals
    log p(y | theta) + log N(theta; 0, I / delta) - 1/2 log det((delta I + H) / 2 pi), computed densely, at the
    prior precision it reports, which maximises it over the grid."""
    import torch

    occam = _research("occam")
    g = torch.Generator().manual_seed(0)
    features = torch.randn(1, 3, generator=g, dtype=torch.float64).expand(3, 3)  # 3 copies of one example
    weight, bias = torch.randn(4, 3, generator=g), torch.randn(4, generator=g)
    y = torch.tensor([2, 2, 2])
    found = occam.last_layer_evidence(features, y, weight, bias)

    theta = torch.cat([weight.double(), bias.double()[:, None]], 1)
    phi = torch.cat([features, torch.ones(3, 1, dtype=torch.float64)], 1)

    def nll(flat):
        return -torch.log_softmax(phi @ flat.view(4, 4).T, -1)[:, 2].sum()

    hessian = torch.autograd.functional.hessian(nll, theta.flatten())

    def evidence(delta: float) -> float:
        count = theta.numel()
        prior = -0.5 * count * math.log(2 * math.pi / delta) - 0.5 * delta * float(theta.pow(2).sum())
        _, logdet = torch.linalg.slogdet((delta * torch.eye(count, dtype=torch.float64) + hessian) / (2 * math.pi))
        return -float(nll(theta.flatten())) + prior - 0.5 * float(logdet)

    delta = found["prior_precision"]
    assert math.isclose(found["evidence"], evidence(delta), rel_tol=1e-9)
    assert math.isclose(found["loglik"], -float(nll(theta.flatten())), rel_tol=1e-12)
    assert all(evidence(d) <= found["evidence"] + 1e-9 for d in occam.PRIOR_PRECISIONS.tolist())


def _small_convnet(bias: bool):
    """A convolution, ReLU, pooling and a classifier, without BatchNorm: its examples are independent."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3, padding=1, bias=bias), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(12, 4),
    )  # fmt: skip


def test_kronecker_factors_at_one_view_are_laplace_torchs():
    """At range 0 every view is the example itself, so reducing over the views is plain KFAC: each layer's factors
    equal laplace-torch's exact (type-2) Kronecker-factored GGN of the model on the examples (curvlinops' KFAC,
    positions expanded), weight and bias kept apart there and joined here."""
    import torch
    from laplace.curvature import CurvlinopsGGN

    from partition_fx.transforms import AffineAugmentation

    occam = _research("occam")
    model = _small_convnet(bias=True).double()
    x, y = torch.randn(5, 1, 6, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 1])
    aug = AffineAugmentation.fixed({"rotation": 0.0}, generators=["rotation"]).double()
    loglik, factors = occam.kronecker_factors(model, aug, x, y, batch=3)
    _, kron = CurvlinopsGGN(model, "classification").kron(x, y, N=len(x))
    (conv_b, conv_a), (conv_bias,), (fc_b, fc_a), (fc_bias,) = kron.kfacs
    for layer, b, a, bias_b in ((factors["0"], conv_b, conv_a, conv_bias), (factors["4"], fc_b, fc_a, fc_bias)):
        torch.testing.assert_close(layer.b, b.double())
        torch.testing.assert_close(layer.a[:-1, :-1], a.double())
        torch.testing.assert_close(layer.a[-1, -1] * layer.b, bias_b.double())  # the bias's input is 1
    assert math.isclose(loglik, float(-torch.nn.functional.cross_entropy(model(x).detach(), y, reduction="sum")))


def test_the_classifiers_factors_over_differing_views_are_its_exact_ggn():
    """The invariant model's logits are the classifier applied to the views' mean features, so for one example its
    Kronecker factors are its exact generalised Gauss-Newton block J^T Lambda J (J the logits' Jacobian in the
    classifier's weight and bias, computed densely)."""
    import torch

    from partition_fx.transforms import AffineAugmentation

    occam = _research("occam")
    model = _small_convnet(bias=False).double()
    x, y = torch.randn(1, 1, 6, 6, dtype=torch.float64), torch.tensor([2])
    aug = AffineAugmentation.fixed({"rotation": 1.0}, generators=["rotation"]).double()
    _, factors = occam.kronecker_factors(model, aug, x, y, batch=1)
    views = aug.transform(x, occam.midpoint_draws()[:, None, :])
    features = model[:4](views).detach()
    assert float((features - features.mean(0)).abs().max()) > 1e-3  # the views differ

    def logits(theta):
        return features.mean(0) @ theta[:, :-1].T + theta[:, -1]

    theta = torch.cat([model[4].weight, model[4].bias[:, None]], 1).detach()
    jacobian = torch.func.jacrev(logits)(theta).flatten(1)  # [classes, classes * (features + 1)]
    p = torch.softmax(logits(theta), -1)
    ggn = jacobian.T @ (torch.diag(p) - torch.outer(p, p)) @ jacobian  # rows ordered (class, input)
    torch.testing.assert_close(torch.kron(factors["4"].b, factors["4"].a), ggn)


def test_network_occam_of_a_classifier_alone_is_the_last_layer_occam():
    """With the classifier its only layer, the whole network's Occam term and log-likelihood are the last-layer
    evidence's: one Kronecker-factored block, its prior precision the grid's best (found coarse, then fine)."""
    import torch

    from partition_fx.transforms import AffineAugmentation

    occam = _research("occam")
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 4)).double()
    x, y = torch.randn(20, 1, 6, 6, dtype=torch.float64), torch.randint(0, 4, (20,))
    aug = AffineAugmentation.fixed({"rotation": 0.7}, generators=["rotation"]).double()
    loglik, factors = occam.kronecker_factors(model, aug, x, y, batch=8)
    total, deltas = occam.network_occam(factors)
    views = aug.transform(x, occam.midpoint_draws()[:, None, :].expand(-1, 20, 1))
    features = views.view(8, 20, -1).mean(0)  # the transform stacks the views' batches
    last = occam.last_layer_evidence(features, y, model[1].weight.detach(), model[1].bias.detach())
    assert math.isclose(loglik, last["loglik"], rel_tol=1e-9)
    assert math.isclose(total, last["occam"], rel_tol=1e-9) and deltas == {"1": last["prior_precision"]}


def test_kronecker_factors_refuse_a_grouped_convolution():
    import torch

    from partition_fx.transforms import AffineAugmentation

    model = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3, groups=2), torch.nn.Flatten())
    aug = AffineAugmentation.fixed({"rotation": 0.0}, generators=["rotation"])
    with pytest.raises(ValueError, match="0 is a grouped or non-zero-padded convolution"):
        _research("occam").kronecker_factors(model, aug, torch.zeros(1, 2, 4, 4), torch.tensor([0]), batch=1)


def test_occam_benchmark_quick(capsys):
    result = _research("occam").main(["--quick"])
    rows = result["rows"]
    assert [r["offset"] for r in rows] == [None, -0.8, -0.4, 0.0, 0.4, 0.8] and rows[0]["scored_at"] == 0.0
    assert all(math.isclose(r["evidence"], r["loglik"] + r["occam"]) for r in rows)
    (line,) = result["summary"]["secants"]
    at = {r["offset"]: r for r in rows}
    width = at[0.4]["scored_at"] - at[-0.4]["scored_at"]
    assert math.isclose(line["evidence"]["secant"], (at[0.4]["evidence"] - at[-0.4]["evidence"]) / width)
    assert line["evidence"]["preferred"] == [max(rows, key=lambda r: r["evidence"])["scored_at"]]
    assert "rotdigits rotation trained at 0.500 seed 0, scored at 0.000" in capsys.readouterr().out
    from research import tables

    table = tables.TABLES["occam"](result)
    assert "Laplace: Occam: secant" in table and "whole network" not in table
    json.dumps(result)  # as it is written


@pytest.mark.slow  # the whole network's factors over the training split at 6 ranges: about 10 minutes on 2 cores
def test_occam_benchmark_quick_with_the_whole_network(capsys):
    result = _research("occam").main(["--quick", "--network"])
    rows = result["rows"]
    assert all(math.isclose(r["network_evidence"], r["loglik"] + r["network_occam"]) for r in rows)
    (line,) = result["summary"]["secants"]
    assert line["network_evidence"]["preferred"] == [max(rows, key=lambda r: r["network_evidence"])["scored_at"]]
    assert "network_occam" in capsys.readouterr().out
    from research import tables

    assert "whole network: Occam: secant" in tables.TABLES["occam"](result)


def test_occam_table_shows_the_whole_network_where_it_was_scored():
    """The summary's secants and largest-at of hand-made rows, and the table's columns for them."""
    from research import tables

    occam = _research("occam")
    rows = [
        {"data": "scaledigits", "generator": "scale", "r": 0.5, "seed": seed, "offset": offset, "scored_at": at,
         "conditional_lml": -at, "loglik": 0.0, "occam": at, "evidence": at, "network_occam": 10 * at,
         "network_evidence": 10 * at - seed}
        for seed in (0, 1) for offset, at in ((None, 0.0), (-0.4, 0.5 * math.exp(-0.4)), (0.4, 0.5 * math.exp(0.4)))
    ]  # fmt: skip
    (line,) = occam.summary(rows, 0.4)
    assert line["network_evidence"]["secant"] == pytest.approx(10) and line["network_evidence"]["positive"] == 2
    assert line["network_evidence"]["preferred"] == [0.5 * math.exp(0.4)] * 2
    table = tables.TABLES["occam"]({"summary": {"secants": [line]}})
    assert "whole network: Occam: secant | whole network: evidence: secant" in table
    assert table.endswith("| +10.0 ± 0.0 (2/2 > 0) | +10.0 ± 0.0 (2/2 > 0) | 0.00, 0.00 | 0.75, 0.75 | 0.75, 0.75 |")
    (one,) = occam.summary(rows[:3], 0.4)  # one seed: no standard error
    assert "| +10.0 (1/1 > 0) | +10.0 (1/1 > 0) | 0.00 | 0.75 | 0.75 |" in tables.TABLES["occam"](
        {"summary": {"secants": [one]}}
    )


def test_occam_follow_moves_to_the_best_scored_range(capsys):
    occam = _research("occam")
    result = occam.main(["--quick", "--follow", "--objectives", "evidence", "conditional_lml"])
    assert [row["objective"] for row in result["rows"]] == ["evidence", "conditional_lml"]
    for row in result["rows"]:
        (decision,) = row["decisions"]  # 4 iterations, a decision every 2: one before the last 2
        assert decision["step"] == 2 and decision["r"] == row["start"] == 0.5
        scored = {sign: occam.OBJECTIVES[row["objective"]](s) for sign, s in decision["scores"].items()}
        best = max(scored, key=scored.get)
        assert math.isclose(decision["chosen"], 0.5 * math.exp(int(best) * 0.4)) and row["final"] == decision["chosen"]
    assert "rotdigits rotation from 0.500 seed 0 (conditional_lml): " in capsys.readouterr().out
    from research import tables

    assert f"{result['rows'][0]['final']:.3f}" in tables.TABLES["occam_follow"](result)
    json.dumps(result)  # as it is written


def test_zoom_profile_scores_the_run_trained_at_each_zoom_at_r_and_2r(capsys):
    """Each row's evidence is the conditional LML, on the midpoint views, of the run trained with the zoom fixed at
    r, scored at r and at 2r; ``--parts evidence`` leaves the plain model's accuracy out of the rows and the table."""
    from research import tables
    from research.fixed_range import train_at_fixed_range
    from research.probes import conditional_lml

    result = _research("zoom_profile").main(["--quick"])
    rows = result["rows"]
    assert [(row["r"], row["seed"]) for row in rows] == [(0.2, 0), (0.5, 0)]
    run = train_at_fixed_range("scaledigits", "scale", 0.5, 0, steps=3, image_size=8, total=5)
    for scored, key in ((0.5, "lml_at_r"), (1.0, "lml_at_2r")):
        assert rows[1][key] == conditional_lml(run.pmodel, "scale", scored, run.x, run.y, run.chunks, 4)
    assert all(0 <= row["test_accuracy"] <= 1 for row in rows)
    assert result["summary"]["peaks"]["lml_at_r"] == max(rows, key=lambda row: row["lml_at_r"])["r"]
    assert "zoom 0.50 seed 0: conditional LML" in capsys.readouterr().out
    evidence = _research("zoom_profile").main(["--quick", "--parts", "evidence"])
    assert [row["lml_at_r"] for row in evidence["rows"]] == [row["lml_at_r"] for row in rows]
    assert all("test_accuracy" not in row for row in evidence["rows"])
    assert "| 0.50 | 0.72x |" in tables.TABLES["zoom_profile"](evidence) and "| - |" in tables.TABLES["zoom_profile"](
        evidence
    )
    json.dumps(result)  # as it is written


def test_range_trajectories_give_each_run_its_target_range_at_each_evaluation():
    """One line per run: the rotation on rotdigits, the zoom on scaledigits, each value under the iteration it was
    evaluated at; a shorter run leaves the longer run's later iterations blank."""
    from research import tables

    def ranges(rotation, scale):
        return {"rotation": rotation, "scale": scale}

    rows = [
        {"data": "rotdigits", "augment": "zero", "seeds": [0], "ranges_trajectories": [[(40, ranges(0.5, 0.1))]]},
        {
            "data": "scaledigits",
            "augment": "zero",
            "seeds": [3, 4],
            "ranges_trajectories": [
                [(40, ranges(0.9, 0.125)), (80, ranges(0.9, 0.25))],
                [(40, ranges(0.9, 0.375)), (80, ranges(0.9, 0.5))],
            ],
        },
    ]
    lines = tables.TABLES["range_trajectories"]({"rows": rows}).splitlines()
    assert lines[0].endswith("| seed | 40 | 80 |")
    assert lines[2].endswith("| rotation | 0 | 0.50 |  |")
    assert lines[3].endswith("| scale | 3 | 0.12 | 0.25 |") and lines[4].endswith("| scale | 4 | 0.38 | 0.50 |")


def test_targets_judge_each_run_and_paired_differences_by_their_definitions(tmp_path, monkeypatch):
    targets = _research("targets")
    meta = {"benchmark": "learned_augmentation", "device": "cpu", "machine": "x86_64"}

    def arm(augment, seeds, rotations, accuracies, averaged):
        return {
            "data": "rotdigits",
            "augment": augment,
            "seeds": seeds,
            "ranges": [{"rotation": r} for r in rotations],
            "test_accuracy": accuracies,
            "averaged_test_accuracy": averaged,
        }

    rows = [
        arm("affine", [0, 1, 2], [2.4, 2.6, 3.0], [0.90, 0.95, 0.97], [0.91, 0.95, 0.96]),
        arm("oracle", [1, 0], [3.1416] * 2, [0.94, 0.92], [0.95, 0.90]),  # seed 2 missing: paired over 0 and 1
    ]
    (tmp_path / "runs.json").write_text(json.dumps({"meta": meta, "config": {}, "rows": rows}))
    rotation = targets.RangeTarget(
        "r", "runs.json", "rotdigits", "affine", "pi", targets._rotation, targets._at_least(2.5)
    )
    within = targets.ModelTarget("m", "rotdigits", "runs.json", "affine", "runs.json", "oracle", "within")
    ahead = targets.ModelTarget("m", "rotdigits", "runs.json", "affine", "runs.json", "oracle", "ahead")
    monkeypatch.setattr(targets, "RANGE_TARGETS", [rotation])
    monkeypatch.setattr(targets, "MODEL_TARGETS", [within, ahead])
    ranges, plain, averaged, plain_ahead, averaged_ahead = targets.gather(tmp_path)
    assert ranges["values"] == [[2.4], [2.6], [3.0]] and (ranges["met"], ranges["runs"]) == (2, 3)
    assert math.isclose(ranges["mean"][0], 8.0 / 3) and math.isclose(
        ranges["standard_error"][0], 0.3055 / 3**0.5, rel_tol=1e-3
    )
    # plain: 0.90 - 0.92 and 0.95 - 0.94 = -2 and +1 points, mean -0.5, standard error 1.5
    assert plain["seeds"] == [0, 1] and [round(v, 9) for v in plain["values"]] == [-2.0, 1.0]
    assert math.isclose(plain["mean"], -0.5) and math.isclose(plain["standard_error"], 1.5)
    assert plain["met"] and not plain_ahead["met"]  # within one SE of the reference, not ahead of it
    # averaged: +1 and 0 points, mean +0.5 and standard error 0.5: within, and not ahead by more than one SE
    assert math.isclose(averaged["mean"], 0.5) and averaged["met"] and not averaged_ahead["met"]
    from research import tables

    assert "2.40, 2.60, 3.00 | 2.67 ± 0.18 | 2 of 3" in tables.TABLES["target_ranges"]({"rows": [ranges]})


def test_targets_benchmark_quick_reads_every_target_from_the_committed_results(capsys):
    targets = _research("targets")
    rows = targets.main(["--quick"])["rows"]
    assert len(rows) == len(targets.RANGE_TARGETS) + 2 * len(targets.MODEL_TARGETS)
    assert all(0 <= row["met"] <= row["runs"] for row in rows if row["kind"] == "ranges")
    assert "| zoom / truth in 0.8-1.25 | scaledigits | twice the truth |" in capsys.readouterr().out
