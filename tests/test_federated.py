"""Federated partitioned training (appendix J) against its definitions: the client split, a client's round
(each partition trained alone from the server values), the server's per-partition FedAdam, and the whole run
on Flower's simulation engine against the same algorithm as a plain loop in this process."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.federated import client_chunks, dirichlet_split
from partition_fx.federated.algorithm import ClientUpdate, FederatedServer, client_update
from partition_fx.training import Categorical
from partition_fx.training.lml import forward_log_likelihood
from partition_fx.transforms import ConcreteDropout, InputMask


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 120), groups=st.integers(1, 6), clients=st.integers(1, 20), seed=st.integers(0, 99))
def test_dirichlet_split_gives_every_example_to_one_client_in_equal_shares(n, groups, clients, seed) -> None:
    labels = torch.arange(n) % groups
    if clients > n:
        with pytest.raises(PartitionArgumentError, match="at most"):
            dirichlet_split(labels, clients, 0.5, seed)
        return
    split = dirichlet_split(labels, clients, 0.5, seed)
    assert sorted(torch.cat(split).tolist()) == list(range(n))
    assert max(map(len, split)) - min(map(len, split)) <= 1
    assert all(torch.equal(a, b) for a, b in zip(split, dirichlet_split(labels, clients, 0.5, seed)))


def test_small_alpha_skews_the_clients_labels() -> None:
    labels = torch.arange(1000) % 10
    distinct = {alpha: sum(len(set(labels[c].tolist())) for c in dirichlet_split(labels, 50, alpha, 0)) / 50
                for alpha in (0.1, 100.0)}  # fmt: skip
    assert distinct[0.1] < 3 < 8 < distinct[100.0]
    with pytest.raises(PartitionArgumentError, match="alpha must be > 0"):
        dirichlet_split(labels, 5, 0.0)


def test_client_chunks_follow_the_proportions_and_refuse_an_empty_chunk() -> None:
    chunks = client_chunks(100, (0.7, 0.2, 0.1), seed=1)
    assert [chunks.count(k) for k in (1, 2, 3)] == [70, 20, 10] and chunks != sorted(chunks)
    with pytest.raises(PartitionArgumentError, match="without a client"):
        client_chunks(3, (0.7, 0.2, 0.1))


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), ConcreteDropout(), torch.nn.Linear(8, 3))
    return partitionify(model, 3, (0.6, 0.3, 0.1)), Categorical(), InputMask(5)


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=generator)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def test_a_client_trains_each_partition_alone_from_the_server_values() -> None:
    """Definition: with one full batch, partition j's update is one SGD step through subnetwork j at the
    server values, the other partitions at theirs; partitions 1..k-1 are not sent; psi's gradient is that of
    subnetwork k-1; the client's model is left as the server sent it."""
    pmodel, likelihood, hyper = _setup()
    x, y = _data(12, 0)
    before = {k: v.clone() for k, v in pmodel.state_dict().items()}
    update = client_update(pmodel, likelihood, hyper, (x, y), k=2, lr=0.1, batch_size=12)
    torch.manual_seed(0)  # the client's seed: the same dropout noise, drawn in the same order below
    order = torch.Generator().manual_seed(0)  # the client's epoch order (seed=0), one permutation per partition
    assert sorted(update.partitions) == [2, 3] and update.num_examples == 12
    for j in (2, 3):
        params = pmodel.partition_parameters(j)
        batch = torch.randperm(12, generator=order)
        loss = -forward_log_likelihood(pmodel, likelihood, x[batch], y[batch], j, hyper, transform_grad=False).mean()
        grads = torch.autograd.grad(loss, params)
        for new, p, g in zip(update.partitions[j], params, grads):
            torch.testing.assert_close(new, p.detach() - 0.1 * g)
    psi = [*(m.logit_p for _, m in pmodel.hyperparameter_modules()), hyper.logits]  # the model's, then the input's
    loss = -forward_log_likelihood(pmodel, likelihood, x, y, 1, hyper).mean()
    for got, want in zip(update.psi_gradient, torch.autograd.grad(loss, psi)):
        torch.testing.assert_close(got, want)
    assert all(torch.equal(v, pmodel.state_dict()[k]) for k, v in before.items())
    assert client_update(pmodel, likelihood, hyper, (x, y), k=1).psi_gradient is None  # chunk 1: no psi term


def test_the_server_takes_a_fedadam_step_per_partition_sent() -> None:
    """Definition: Adam on minus the example-weighted mean delta; a partition nobody sent keeps its values and
    its Adam state."""
    pmodel, likelihood, hyper = _setup()
    server = FederatedServer(pmodel, likelihood, hyper, lr=0.01)
    p2 = pmodel.partition_parameters(2)
    sent = [[p.detach() + 1.0 for p in p2], [p.detach() + 3.0 for p in p2]]
    updates = [ClientUpdate(0, 2, 30, {2: sent[0]}, None), ClientUpdate(1, 2, 10, {2: sent[1]}, None)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in p2]
    adam = torch.optim.Adam(reference, lr=0.01)
    for r in reference:
        r.grad = -(0.75 * 1.0 + 0.25 * 3.0) * torch.ones_like(r)
    adam.step()
    untouched = [p.detach().clone() for j in (1, 3) for p in pmodel.partition_parameters(j)]
    server.apply(updates)
    for p, r in zip(p2, reference):
        torch.testing.assert_close(p.detach(), r.detach())
    assert all(
        torch.equal(a, b) for a, b in zip(untouched, [p for j in (1, 3) for p in pmodel.partition_parameters(j)])
    )
    assert all(p not in server.optimizer.state for j in (1, 3) for p in pmodel.partition_parameters(j))


def _factory():
    return _setup()


def test_flower_runs_the_algorithm_of_the_plain_loop_and_uploads_only_the_chunks_partitions() -> None:
    pytest.importorskip("flwr", reason="the federated extra: pip install -e '.[federated]'")
    from partition_fx.federated.flower import run_flower

    data = [_data(n, seed) for seed, n in enumerate((10, 14, 9))]
    chunks = [1, 2, 3]
    rounds = []
    run = run_flower(_factory, data, chunks, rounds=2, lr=0.1, batch_size=8, seed=3, cpus=2,
                     evaluate=lambda pmodel, hyper: {"clients": 3.0}, evaluate_every=2,
                     on_round=lambda r, point: rounds.append((r, point)))  # fmt: skip
    pmodel, likelihood, hyper = _setup()
    server = FederatedServer(pmodel, likelihood, hyper)
    for round_ in (1, 2):
        updates = [
            client_update(
                pmodel,
                likelihood,
                hyper,
                data[c],
                chunks[c],
                client=c,
                lr=0.1,
                batch_size=8,
                seed=3 * 1_000_003 + round_ * 1009 + c,
            )
            for c in range(3)
        ]
        server.apply(updates)
    for (name, got), want in zip(run.pmodel.state_dict().items(), pmodel.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)
    torch.testing.assert_close(run.hyper.logits, hyper.logits)
    assert [c["round"] for c in run.curve] == [2] and rounds == [(0, None), (1, None), (2, run.curve[0])]
    assert 0 < run.bytes_up < run.bytes_down  # chunk 2 and 3 clients upload 2 and 1 of the 3 partitions


def test_federated_command_writes_the_report_with_its_baseline(tmp_path, capsys) -> None:
    pytest.importorskip("flwr", reason="the federated extra: pip install -e '.[federated]'")
    import json

    from partition_fx.cli import main

    out = tmp_path / "fed"
    argv = ["federated", "--clients", "6", "--rounds", "2", "--image-size", "8", "--evaluate-every", "1"]
    assert main([*argv, "--quiet", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "model.safetensors", "report.json"]
    assert report["rounds"] == 2 and 0 <= report["test_accuracy"] <= 1 and 0 <= report["baseline"]["test_accuracy"] <= 1
    chunks = report["clients"]["chunks"]  # 4, 1 and 1 of the 6 clients
    shares = {1: 1.0, 2: 0.3, 3: 0.1}  # partitions k..C of 0.7/0.2/0.1 (the psi gradients add a few bytes)
    expected = sum(shares[k] for k in chunks) / len(chunks)
    assert abs(report["upload_share"] - expected) < 0.02, (report["upload_share"], expected)
    # The server sends every partition: the model's entries once, plus psi, scale copies and metadata, a
    # little more than the baseline's model; the saving is in the upload. (This was "bytes_down equal or
    # traffic_share < 1": the downloads never are equal, so only traffic_share < 1 was checked, and a
    # traffic_share counting the uploads alone passed it.)
    base = report["baseline"]
    assert base["bytes_down"] < report["bytes_down"] < 1.01 * base["bytes_down"]
    total = (report["bytes_up"] + report["bytes_down"]) / (base["bytes_up"] + base["bytes_down"])
    assert report["traffic_share"] == pytest.approx(total) and total < 1
    assert [p["round"] for p in report["curves"]["partitioned"]] == [1, 2]
    dropout = ["dropout1.p", "dropout2.p", "dropout3.p", "dropout4.p"]  # the CNN's named layers, not 3.p, 7.p, ..
    assert [k for k in report["hyperparameters"] if k.endswith(".p")] == dropout
    assert report["hyperparameters"].keys() == report["baseline"]["hyperparameters"].keys()
    printed = capsys.readouterr()
    assert "test accuracy" in printed.out and all(f"{name}=" in printed.out for name in dropout), printed.out
    assert printed.err == ""  # --quiet: no progress


ROUND_LINE = re.compile(
    r"^partition-fx: (partitioned|baseline) round (\d)/3 \| test accuracy [01]\.\d{4} \| traffic (\d+\.\d) MB \| "
    r"\d+:\d\d elapsed, ~\d+:\d\d left$"
)


def test_federated_command_without_a_terminal_prints_a_line_per_evaluated_round_of_each_run(tmp_path, capsys):
    """stderr is not a terminal here (captured): one line per evaluation (rounds 2 and 3 with
    --evaluate-every 2), the partitioned run's, then the baseline's, with the bytes so far growing."""
    pytest.importorskip("flwr", reason="the federated extra: pip install -e '.[federated]'")
    from partition_fx.cli import main

    argv = ["federated", "--clients", "6", "--rounds", "3", "--image-size", "8", "--evaluate-every", "2"]
    assert main([*argv, "--out", str(tmp_path / "fed")]) == 0
    lines = capsys.readouterr().err.splitlines()
    matches = [ROUND_LINE.match(line) for line in lines]
    assert len(lines) == 4 and all(matches), lines
    assert [m.group(1, 2) for m in matches] == [("partitioned", "2"), ("partitioned", "3"), ("baseline", "2"),
                                                ("baseline", "3")]  # fmt: skip
    assert float(matches[0].group(3)) < float(matches[1].group(3))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--alpha", "0"], "--alpha 0.0: the Dirichlet concentration must be > 0"),
        (["--clients", "5000"], "--clients 5000: more clients than the"),
        (["--clients", "4"], "leave chunk 3 without a client"),
        (["--proportions", "0.5,0.5"], "--proportions 0.5,0.5: give 3 positive shares"),
        (["--image-size", "10"], "--image-size must be a multiple of 4"),
    ],
)
def test_bad_federated_input_is_one_clear_line_and_writes_nothing(tmp_path, capsys, argv, fragment) -> None:
    from partition_fx.cli import main

    out = tmp_path / "never"
    assert main(["federated", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not out.exists()


def test_federated_without_flower_says_how_to_install_it(tmp_path, capsys, monkeypatch) -> None:
    import builtins

    from partition_fx.cli import main

    real_import = builtins.__import__

    def no_flower(name, *args, **kwargs):
        if name == "flwr" or name.startswith("flwr."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flower)
    out = tmp_path / "never"
    assert main(["federated", "--clients", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[federated]"' in err and not out.exists()


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_alpha_has_one_check_for_the_library_and_the_command_line(alpha) -> None:
    """dirichlet_split, plan_clients (through it) and the command line refuse the same values by one check
    (``_validation.check_concentration``), the command line naming --alpha; inf too, which numpy turned into NaN
    probabilities."""
    from partition_fx.cli.checks import check_federated_options
    from partition_fx.cli.parser import build_parser
    from partition_fx.datasets import digits
    from partition_fx.federated.job import plan_clients

    with pytest.raises(PartitionArgumentError, match="alpha must be > 0 and finite"):
        dirichlet_split(torch.arange(20) % 4, 4, alpha)
    with pytest.raises(PartitionArgumentError, match="alpha must be > 0 and finite"):
        plan_clients(digits(size=8), 10, alpha, (0.7, 0.2, 0.1))
    args = build_parser().parse_args(["federated", f"--alpha={alpha}"])
    with pytest.raises(PartitionArgumentError, match="^" + re.escape(f"--alpha {alpha}: the Dirichlet concentration")):
        check_federated_options(args)


def test_federated_options_parse_and_default_as_trains(capsys) -> None:
    """--proportions and --seed go through the shared parsers (train's refusals), and --proportions left out
    means the default shares with 3 partitions and equal shares with any other, as train's help says."""
    from partition_fx.cli.checks import check_federated_options
    from partition_fx.cli.parser import build_parser

    for option, value, fragment in [
        ("--proportions", "a,b", "comma-separated numbers"),
        ("--seed", "-1", "must be >= 0"),
        ("--seed", str(2**63), "at most 2**63-1"),
    ]:
        for command in ("train", "federated"):
            with pytest.raises(SystemExit):
                build_parser().parse_args([command, f"{option}={value}"])
            assert fragment in capsys.readouterr().err, (command, option, value)

    def parse(*argv: str):
        return build_parser().parse_args(["federated", *argv])

    assert check_federated_options(parse()) == (0.7, 0.2, 0.1)
    assert check_federated_options(parse("--partitions", "4")) == (0.25, 0.25, 0.25, 0.25)
    assert check_federated_options(parse("--partitions", "2", "--proportions", "0.6,0.4")) == (0.6, 0.4)
    with pytest.raises(PartitionArgumentError, match=r"^--partitions 300: num_partitions must be <= 255"):
        check_federated_options(parse("--partitions", "300"))
    with pytest.raises(PartitionArgumentError, match=r"^--proportions 0\.9,0\.1,0\.0: give 3 positive shares"):
        check_federated_options(parse("--proportions", "0.9,0.1,0"))
    sub = build_parser()._subparsers._group_actions[0].choices["federated"]
    [proportions] = [a for a in sub._actions if a.dest == "proportions"]
    assert proportions.help.endswith(
        "(default: 0.7,0.2,0.1 with 3 partitions, equal shares with any other --partitions)"
    )
