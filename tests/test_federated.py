"""Federated partitioned training (appendix J) against its definitions: the client split, a client's round
(each partition trained alone from the server values), the server's per-partition FedAdam, and the whole run
on Flower's simulation engine against the same algorithm as a plain loop in this process."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.federated import client_chunks, dirichlet_split
from partition_fx.federated.algorithm import ClientUpdate, FederatedServer, client_update
from partition_fx.training import Categorical
from partition_fx.training.objective.lml import forward_log_likelihood
from partition_fx.training.objective.objective import Objective
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


def test_a_fine_tuning_round_trains_the_exported_final_model_on_all_the_clients_data() -> None:
    """Definition: a fine-tuning round is local SGD on the final subnetwork as exported (every partition at
    once, psi applied but not learned), whatever the client's chunk; every partition comes back, no psi
    gradient, and the client's model is left as the server sent it."""
    from partition_fx import export_subnetwork

    torch.manual_seed(0)
    pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)), 3)
    x, y = _data(20, 1)
    before = {k: v.clone() for k, v in pmodel.state_dict().items()}
    update = client_update(pmodel, Categorical(), None, (x, y), k=3, lr=0.1, batch_size=8, seed=5, epochs=2,
                           finetune=True)  # fmt: skip
    assert sorted(update.partitions) == [1, 2, 3] and update.psi_gradient is None and update.num_examples == 20
    assert all(torch.equal(v, pmodel.state_dict()[k]) for k, v in before.items())
    final = export_subnetwork(pmodel)  # a plain Sequential with the final subnetwork's weights
    optimizer = torch.optim.SGD(final.parameters(), lr=0.1)
    order = torch.Generator().manual_seed(5)  # the client's epoch order
    for _ in range(2):
        for batch in torch.randperm(20, generator=order).split(8):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(final(x[batch]), y[batch]).backward()
            optimizer.step()
    names = [n for j in (1, 2, 3) for n in _partition_names(pmodel, j)]
    values = [t for j in (1, 2, 3) for t in update.partitions[j]]
    pmodel.load_state_dict({**pmodel.state_dict(), **dict(zip(names, values))})
    trained = export_subnetwork(pmodel)
    for (name, got), want in zip(trained.state_dict().items(), final.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)


def _partition_names(pmodel, j: int) -> list[str]:
    """The state-dict names of ``pmodel.partition_parameters(j)``, in its order."""
    names = {id(p): n for n, p in pmodel.named_parameters()}
    return [names[id(p)] for p in pmodel.partition_parameters(j)]


def test_the_baselines_fine_tuning_round_is_its_ordinary_round() -> None:
    """With one partition the final subnetwork is the whole model: the fine-tuning phase changes nothing for the
    FedAdam baseline, bit for bit."""
    torch.manual_seed(0)
    pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(5, 8), ConcreteDropout(), torch.nn.Linear(8, 3)), 1)
    data = _data(20, 2)
    plain = client_update(pmodel, Categorical(), None, data, k=1, batch_size=8, seed=4)
    tuned = client_update(pmodel, Categorical(), None, data, k=1, batch_size=8, seed=4, finetune=True)
    assert all(torch.equal(a, b) for a, b in zip(plain.partitions[1], tuned.partitions[1]))
    assert plain.train_loss == tuned.train_loss


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


FLOWER = "the federated extra: pip install -e '.[federated]'"
TINY = {"data": "digits", "image_size": 8, "clients": 6, "samples": 2, "test_samples": 2}


def _tiny(**overrides):
    from partition_fx.federated import FederatedConfig

    return FederatedConfig(**{**TINY, **overrides})


def test_a_client_finds_its_share_by_its_partition_id_from_the_shared_seed() -> None:
    """Definition: every client computes the same plan from the run's config; client i's training share is
    the Dirichlet split's entry i of the training split (its test share that of the test split), its chunk
    ``client_chunks``' entry i; together the shares are the whole data, once."""
    from partition_fx.datasets import digits
    from partition_fx.federated.job import client_data, plan_clients

    data = digits(size=8)
    plan = plan_clients(data, 10, 0.1, (0.7, 0.2, 0.1), seed=4)
    again = plan_clients(data, 10, 0.1, (0.7, 0.2, 0.1), seed=4)  # another client, another process
    groups = data.train.tensors[1]
    want = dirichlet_split(groups, 10, 0.1, 4)
    assert all(torch.equal(a, b) for a, b in zip(plan.clients, want))
    assert all(torch.equal(a, b) for a, b in zip(plan.test_clients, again.test_clients))
    assert plan.chunks == client_chunks(10, (0.7, 0.2, 0.1), 4) == again.chunks
    assert sorted(torch.cat(plan.test_clients).tolist()) == list(range(len(data.test)))
    share = client_data(data, plan, 3)
    x, y = data.train.tensors
    assert torch.equal(share.train[0], x[want[3]]) and torch.equal(share.train[1], y[want[3]])
    assert share.chunk == plan.chunks[3] and len(share.test[1]) == len(plan.test_clients[3])


def test_the_config_is_flowers_run_config_and_scales_psis_learning_rate() -> None:
    from partition_fx.federated import FederatedConfig, scaled_hyper_lr

    config = FederatedConfig(rounds=100, proportions=(0.9, 0.1), hyper_lr=None, seed=3)
    assert FederatedConfig.from_run_config(config.run_config()) == config  # clients aside: the federation's
    assert "clients" not in config.run_config() and config.run_config()["proportions"] == "0.9,0.1"
    assert [scaled_hyper_lr(r) for r in (2, 100, 200, 2000, 4000)] == pytest.approx([0.06, 0.06, 0.03, 3e-3, 3e-3])
    with pytest.raises(PartitionArgumentError, match="federation's; set num-supernodes"):
        FederatedConfig.from_run_config({"clients": 5})
    with pytest.raises(PartitionArgumentError, match="unknown run config key 'round'; known: alpha"):
        FederatedConfig.from_run_config({"round": 5})
    with pytest.raises(PartitionArgumentError, match=r"fraction-evaluate must be in \[0, 1\], got 1.5"):
        FederatedConfig(fraction_evaluate=1.5)
    baseline = config.baseline()
    assert baseline.proportions == (1.0,) and not baseline.partitioned and baseline.seed == 3
    assert not baseline.learn_hyperparameters and config.learn_hyperparameters


def test_a_runs_rounds_follow_its_schedule_warm_up_partitioned_then_fine_tuning() -> None:
    """The rounds ask the central path's Schedule: no psi step in the warm-up rounds (the clients send no psi
    gradient), psi steps after them (any model admitted), psi frozen and every partition sent in the
    fine-tuning rounds; the server evaluates after the last partitioned round too."""
    from partition_fx.federated import simulate
    from partition_fx.federated.config import NO_PROGRESS_GATE
    from partition_fx.federated.job import round_schedule

    config = _tiny(rounds=5, evaluate_every=1, warmup_fraction=0.4, finetune_fraction=0.4, samples=1,
                   warmup_progress=NO_PROGRESS_GATE)  # fmt: skip
    schedule = round_schedule(config)
    assert [r for r in range(1, 6) if schedule.hyper_due(r)] == [3, 4, 5]  # the clients skip the fine-tuning's
    assert [r for r in range(1, 6) if schedule.finetunes(r)] == [4, 5]
    run = simulate(config)
    rotation = [point["hyperparameters"]["rotation"] for point in run.curve]
    assert rotation[0] == rotation[1] == pytest.approx(config.rotation_init) != rotation[2]
    assert rotation[2] == rotation[3] == rotation[4]
    assert [{m["chunk"] for m in run.client_train_metrics[r]} for r in (3, 4)] == [{1, 2, 3}, {1}]
    assert [r for r in range(1, 9) if round_schedule(config.replace(rounds=8, evaluate_every=3)).evaluates_at(r)] == [
        3, 5, 6, 8]  # fmt: skip


def _psi_updates(pmodel, heldout: float) -> list:
    """Two clients' replies of chunk 2 with psi's gradient 1 and the given held-out negative log-likelihood."""
    from partition_fx.federated.algorithm import ClientUpdate

    psi = Objective(pmodel, None, Categorical()).hyperparameters()
    partitions = {2: [p.detach().clone() for p in pmodel.partition_parameters(2)]}
    return [ClientUpdate(c, 2, 10, partitions, [torch.ones_like(p) for p in psi], heldout_nll=heldout)
            for c in range(2)]  # fmt: skip


def test_a_client_reports_its_held_out_nll_unaugmented_through_the_subnetwork_that_scores_it() -> None:
    """Definition: with psi's gradient, a client of chunk k sends the mean negative log-likelihood of its own data,
    without augmentation and in eval mode, through subnetwork k-1 at the server's values; chunk 1 sends none."""
    pmodel, likelihood, hyper = _setup()
    data = _data(12, 3)
    update = client_update(pmodel, likelihood, hyper, data, k=3, batch_size=4, seed=1)
    pmodel.eval()
    with torch.no_grad():
        want = -forward_log_likelihood(pmodel, likelihood, *data, 2).mean()
    assert update.heldout_nll == pytest.approx(float(want), abs=1e-6)
    assert math.isnan(client_update(pmodel, likelihood, hyper, data, k=1, batch_size=4, seed=1).heldout_nll)


def test_psi_steps_only_once_the_model_has_learned_and_from_then_on() -> None:
    """Definition of the warm-up by progress: no psi step on a round whose senders' held-out negative
    log-likelihood (example-weighted) is above the threshold; the first round at or below it starts psi, which then
    steps on every round whatever the model's."""
    from partition_fx.federated.algorithm import ProgressWarmup

    pmodel, likelihood, _ = _setup()
    warmup = ProgressWarmup(threshold=0.5)
    server = FederatedServer(pmodel, likelihood, None, hyper_lr=0.1, warmup=warmup)
    rate = lambda: float(next(pmodel.hyperparameter_modules())[1].p.detach())  # noqa: E731
    start = rate()
    server.apply(_psi_updates(pmodel, 0.9), server_round=1)
    assert rate() == start and warmup.started_at is None and warmup.heldout_nll == {1: pytest.approx(0.9)}
    server.apply(_psi_updates(pmodel, 0.5), server_round=2)
    moved = rate()
    assert moved != start and warmup.started_at == 2
    server.apply(_psi_updates(pmodel, 2.0), server_round=3)
    assert rate() != moved and warmup.started_at == 2


def test_a_run_whose_model_never_learns_in_time_fine_tunes_early_without_augmentation_and_says_so() -> None:
    """If psi has not started by the deadline (min_psi_fraction of the rounds before fine-tuning), partitioned
    training ends there: the augmentation's ranges go to 0 (the baseline's), the clients are told to fine-tune
    from the next round, and the run's warmup record has one line saying so. Under Flower too (the server's
    instruction carries the phase)."""
    from partition_fx.federated import simulate
    from partition_fx.federated.flower import run_flower

    config = _tiny(rounds=6, evaluate_every=1, warmup_fraction=0.0, finetune_fraction=0.5, min_psi_fraction=0.34,
                   warmup_progress=1e-6, samples=1)  # fmt: skip
    assert config.psi_deadline == 2  # psi needs rounds 2 and 3
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as Ray runs Flower's apps: the last bits depend on it
    try:
        run = simulate(config)
    finally:
        torch.set_num_threads(threads)
    assert run.warmup["started_at"] is None and run.warmup["partitioned_ended_at"] == 2
    note = run.warmup["note"]
    assert "\n" not in note and "psi learned nothing in 6 rounds" in note and "--rounds" in note
    ranges = [{k: v for k, v in p["hyperparameters"].items() if not k.startswith("dropout")} for p in run.curve]
    assert ranges[0]["rotation"] == pytest.approx(config.rotation_init) and set(ranges[1].values()) == {0.0}
    assert [{m["chunk"] for m in run.client_train_metrics[r]} for r in (2, 3)] == [{1, 2, 3}, {1}]  # fine-tuning
    flower = run_flower(config)
    assert flower.warmup == run.warmup and flower.curve == run.curve


def test_each_client_keeps_a_validation_share_that_the_curve_scores() -> None:
    """validation: each client's share of its training examples, disjoint from what it trains on, the two
    making up its Dirichlet share; the server's curve scores their union; none without it."""
    from partition_fx.datasets import digits
    from partition_fx.federated import simulate
    from partition_fx.federated.job import plan_clients, validation_data

    data = digits(size=8)
    plain, held = (plan_clients(data, 10, 0.1, (0.7, 0.2, 0.1), seed=2, validation=v) for v in (0.0, 0.25))
    for everything, train, validation in zip(plain.clients, held.clients, held.validation_clients):
        assert sorted(torch.cat([train, validation]).tolist()) == everything.tolist()
        assert len(validation) == min(round(0.25 * len(everything)), len(everything) - 1) and len(train) >= 1
    assert validation_data(data, plain) is None and len(validation_data(data, held)[1]) == 360
    point = simulate(_tiny(rounds=1, validation=0.25)).curve[0]
    assert 0 <= point["validation-accuracy"] <= 1 and "validation-accuracy" not in simulate(_tiny(rounds=1)).curve[0]


def test_a_baseline_holds_its_rotation_fixed() -> None:
    """baseline(rotation): one partition, psi frozen with the rotation range there (0: no augmentation, pi: the
    oracle on rotated digits) and nothing else augmented."""
    import math

    from partition_fx.federated import build_federated_model

    for rotation in (0.0, math.pi):
        model = build_federated_model(_tiny().baseline(rotation=rotation), (1, 8, 8), 10)
        ranges = model.hyper.hyperparameters()
        assert ranges["rotation"] == pytest.approx(rotation) and ranges["translation_x"] == 0.0
        assert not any(p.requires_grad for p in model.hyper.parameters()) and model.pmodel.num_partitions == 1


def test_the_flower_app_ships_the_commands_defaults() -> None:
    """examples/flower_app's run config is FederatedConfig's defaults (``num-rounds`` for ``rounds``), ``out``
    aside: ``flwr run`` and ``partition-fx federated`` train the same run."""
    from pathlib import Path

    import tomllib

    from partition_fx.federated import FederatedConfig

    toml = tomllib.loads((Path(__file__).parents[1] / "examples" / "flower_app" / "pyproject.toml").read_text())
    shipped = FederatedConfig.from_run_config(toml["tool"]["flwr"]["app"]["config"])
    assert shipped == FederatedConfig(out="runs/flower-app")


@pytest.fixture
def message_identity():
    """Flower builds a message for the task of the process it runs in; a test is none, so it names one."""
    pytest.importorskip("flwr", reason=FLOWER)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


@settings(max_examples=40, deadline=None)
@given(
    clients=st.integers(1, 60),
    fraction=st.floats(0.01, 1.0),
    rounds=st.integers(1, 5000),
    seed=st.integers(0, 2**32),
    shares=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_config_sampling_and_psi_rate_follow_their_definitions(clients, fraction, rounds, seed, shares) -> None:
    """``sample_clients``: max(1, int(fraction * clients)) distinct clients, sorted, the same for the same
    seed and round; ``scaled_hyper_lr``: the paper's 3e-3 x 2000 / rounds clamped to [3e-3, 0.06]; every
    config survives Flower's run config."""
    from partition_fx.federated import FederatedConfig, scaled_hyper_lr
    from partition_fx.federated.job import sample_clients

    proportions = tuple(x / sum(shares) for x in shares)
    config = FederatedConfig(clients=clients, fraction_train=fraction, rounds=rounds, seed=seed,
                             proportions=proportions)  # fmt: skip
    chosen = sample_clients(config, 3)
    assert len(chosen) == max(1, int(clients * fraction)) and chosen == sorted(set(chosen))
    assert all(0 <= c < clients for c in chosen) and chosen == sample_clients(config, 3)
    assert scaled_hyper_lr(rounds) == pytest.approx(min(0.06, max(3e-3, 3e-3 * 2000 / rounds)))
    assert config.hyper_lr_value == scaled_hyper_lr(rounds)
    again = FederatedConfig.from_run_config(config.run_config())
    assert again == FederatedConfig(**{**config.__dict__, "clients": FederatedConfig().clients})


def _replies(updates):
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.common import MessageType

    from partition_fx.federated.messages import train_reply

    instruction = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=7,
                          message_type=MessageType.TRAIN)  # fmt: skip
    return instruction, [Message(train_reply(u), reply_to=instruction) for u in updates]


def test_the_strategy_aggregates_replies_as_the_server_steps_updates(message_identity, caplog) -> None:
    """Definition: ``PartitionedFedAdam.aggregate_train`` on the replies of a round is ``FederatedServer.apply``
    on their updates (partitions of different chunks, psi's gradients); a failed reply is left out, kept as
    a failure and warned of (accept_failures), or raises (accept_failures=False); a round without replies keeps
    the model. Its default fraction_evaluate 0 (no federated evaluation) is no warning."""
    pytest.importorskip("flwr", reason=FLOWER)
    from flwr.app import Error, Message

    from partition_fx.errors import PartitionError
    from partition_fx.federated import PartitionedFedAdam

    data = [_data(n, seed) for seed, n in enumerate((10, 14, 9))]
    pmodel, likelihood, hyper = _setup()
    updates = [client_update(pmodel, likelihood, hyper, d, k, client=c, seed=c) for c, (d, k) in
               enumerate(zip(data, (1, 2, 3)))]  # fmt: skip
    reference = _setup()
    FederatedServer(*reference).apply(updates)
    strategy = PartitionedFedAdam(FederatedServer(pmodel, likelihood, hyper))
    instruction, replies = _replies(updates)
    failed = Message(Error(code=0, reason="client 3 ran out of memory"), reply_to=instruction)
    arrays, metrics = strategy.aggregate_train(1, [*replies, failed])
    for (name, got), want in zip(pmodel.state_dict().items(), reference[0].state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)
    torch.testing.assert_close(hyper.logits, reference[2].logits)
    assert sorted(arrays) == sorted(strategy.initial_arrays()) and metrics["clients"] == 3 and metrics["failures"] == 1
    assert [c["chunk"] for c in strategy.client_train_metrics[1]] == [1.0, 2.0, 3.0]
    assert strategy.failures == {1: ["train: client 3 ran out of memory"]} and strategy.bytes_up > 0
    warned = [r.getMessage() for r in caplog.records if r.name == "flwr" and r.levelname == "WARNING"]
    assert warned == ["round 1: 1 client(s) failed to train, their replies left out (the first: client 3 ran out "
                      "of memory)"]  # fmt: skip
    assert (strategy.fraction_evaluate, strategy.min_evaluate_nodes) == (0.0, 0)
    assert strategy.aggregate_train(2, [failed]) == (None, metrics.__class__({"clients": 0, "failures": 1}))
    strict = PartitionedFedAdam(FederatedServer(*_setup()), accept_failures=False)
    with pytest.raises(
        PartitionError, match=r"1 client\(s\) failed in round 1 \(accept_failures=False\): train: client 3"
    ):
        strict.aggregate_train(1, [*_replies(updates)[1], failed])


def test_flower_runs_the_algorithm_of_the_plain_loop() -> None:
    """The Flower apps on Flower's simulation engine (Ray workers, messages) and ``simulate`` (one process)
    give the same model, psi, curve, traffic and client metrics; the clients upload only their chunks'
    partitions, so less than they download."""
    pytest.importorskip("flwr", reason=FLOWER)
    from partition_fx.federated import run_flower, simulate

    config = _tiny(rounds=3, evaluate_every=1, seed=3, finetune_fraction=0.4)  # round 3 fine-tunes
    rounds = []
    flower = run_flower(config, on_round=lambda r, point: rounds.append((r, point)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as Ray runs Flower's apps (OMP_NUM_THREADS=1): the last bits depend on it
    try:
        loop = simulate(config)
    finally:
        torch.set_num_threads(threads)
    for (name, got), want in zip(flower.model.pmodel.state_dict().items(), loop.model.pmodel.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)
    torch.testing.assert_close(flower.model.hyper.ranges, loop.model.hyper.ranges)
    assert flower.curve == loop.curve and [p["round"] for p in loop.curve] == [1, 2, 3]
    assert (flower.bytes_up, flower.bytes_down) == (loop.bytes_up, loop.bytes_down)
    assert flower.client_train_metrics == loop.client_train_metrics
    assert rounds == [(0, None), *((r, flower.curve[r - 1]) for r in (1, 2, 3))]
    assert {m["chunk"] for m in loop.client_train_metrics[3]} == {1}  # every client sends every partition
    assert loop.curve[2]["hyperparameters"] == loop.curve[1]["hyperparameters"]  # psi frozen
    assert 0 < loop.bytes_up < loop.bytes_down


def test_a_groupnorm_model_trains_federated_and_batchnorm_is_refused(tmp_path, capsys) -> None:
    """GroupNorm keeps no running statistics, so any registry model with it trains (the paper's CIFAR model
    is a GroupNorm ResNet); BatchNorm's statistics would each describe one client's skewed data: refused
    before anything is written."""
    from partition_fx.cli import main
    from partition_fx.federated import simulate

    run = simulate(_tiny(model="cifar_wrn16_4_gn", rounds=1, clients=6, samples=1))
    from partition_fx.export import export_subnetwork

    exported = export_subnetwork(run.model.pmodel)
    assert run.curve[0]["round"] == 1 and any(isinstance(m, torch.nn.GroupNorm) for m in exported.modules())
    out = tmp_path / "never"
    assert main(["federated", "--model", "resnet10t", "--clients", "6", "--image-size", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "keeps running statistics (BatchNorm2d at conv1.1)" in err[0] and "GroupNorm" in err[0]
    assert not out.exists()


def test_federated_command_writes_the_report_with_its_baseline(tmp_path, capsys, caplog) -> None:
    pytest.importorskip("flwr", reason=FLOWER)
    import csv
    import json

    from partition_fx.cli import main

    out = tmp_path / "fed"
    argv = ["federated", "--clients", "6", "--rounds", "2", "--image-size", "8", "--evaluate-every", "1",
            "--samples", "2", "--test-samples", "2", "--log", "csv"]  # fmt: skip
    assert main([*argv, "--quiet", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    written = ["curves.png", "history.json", "metrics.csv", "model.safetensors", "params.csv", "report.json"]
    assert sorted(p.name for p in out.iterdir()) == written
    assert report["rounds"] == 2 and 0 <= report["test_accuracy"] <= 1 and 0 <= report["baseline"]["test_accuracy"] <= 1
    assert report["mean_last_accuracy"] == pytest.approx(
        sum(p["test-accuracy"] for p in report["curves"]["partitioned"]) / 2
    )
    chunks = report["clients"]["chunks"]  # 4, 1 and 1 of the 6 clients
    shares = {1: 1.0, 2: 0.3, 3: 0.1}  # partitions k..C of 0.7/0.2/0.1 (the psi gradients add a few bytes)
    expected = sum(shares[k] for k in chunks) / len(chunks)
    assert abs(report["upload_share"] - expected) < 0.02, (report["upload_share"], expected)
    # The server sends every partition: the model's entries once, plus psi, scale copies and metadata, a
    # little more than the baseline's model; the saving is in the upload.
    base = report["baseline"]
    assert base["bytes_down"] < report["bytes_down"] < 1.01 * base["bytes_down"]
    total = (report["bytes_up"] + report["bytes_down"]) / (base["bytes_up"] + base["bytes_down"])
    assert report["traffic_share"] == pytest.approx(total) and total < 1
    assert [p["round"] for p in report["curves"]["partitioned"]] == [1, 2]
    dropout = ["dropout1.p", "dropout2.p", "dropout3.p", "dropout4.p"]  # the CNN's named layers, not 3.p, 7.p, ..
    assert [k for k in report["hyperparameters"] if k.endswith(".p")] == dropout
    assert report["hyperparameters"].keys() == report["baseline"]["hyperparameters"].keys()
    assert report["baseline"]["hyperparameters"]["rotation"] == 0 < report["hyperparameters"]["rotation"]
    # --log csv: every evaluated round of both runs, by name, and the configuration
    with open(out / "metrics.csv", newline="") as f:
        logged = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)}
    for arm in ("partitioned", "baseline"):
        for point in report["curves"][arm]:
            assert logged[(point["round"], f"{arm}/test_accuracy")] == point["test-accuracy"]
            assert logged[(point["round"], f"{arm}/hyper/rotation")] == point["hyperparameters"]["rotation"]
    with open(out / "params.csv", newline="") as f:
        assert dict(csv.reader(f))["federated.rounds"] == "2"
    history = json.loads((out / "history.json").read_text())
    assert [len(history[arm]["client_train_metrics"]["2"]) for arm in ("partitioned", "baseline")] == [6, 6]
    printed = capsys.readouterr()
    assert "test accuracy" in printed.out and all(f"{name}=" in printed.out for name in dropout), printed.out
    # Two rounds are too few for the model to learn: said in one line, and the model handed back is the baseline's.
    assert report["model"] == "baseline" and report["psi_started_at"] is None
    assert report["note"].startswith("psi learned nothing in 2 rounds") and report["note"] in printed.out
    assert "[ROUND" not in caplog.text and "aggregate_train" not in caplog.text  # --quiet: Flower's log muted


def test_federated_command_output_redirected_is_its_own(tmp_path) -> None:
    """``partition-fx federated ... > log 2>&1``: the command's progress (a line as each run's rounds begin, one
    per evaluated round) and its summary, nothing of Flower's round log at INFO, none of its notices that
    ``run_simulation`` is deprecated, no colour codes, no warning about the default fraction-evaluate 0, nothing
    of Ray's. A separate process, as a user runs it: Flower's console handler writes to the stderr it found when
    imported, which in this process would be pytest's."""
    pytest.importorskip("flwr", reason=FLOWER)
    import os
    import subprocess

    argv = ["federated", "--clients", "2", "--partitions", "2", "--proportions", "0.5,0.5", "--rounds", "2",
            "--evaluate-every", "1", "--image-size", "8", "--samples", "1", "--test-samples", "1"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "FLWR_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "partition_fx.cli", *argv, "--out", str(tmp_path / "fed")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)  # fmt: skip
    log = done.stdout
    assert done.returncode == 0, log[-3000:]
    assert "\x1b[" not in log and "DEPRECATED" not in log and "INFO" not in log and "WARNING" not in log, log
    lines = log.splitlines()
    progress = [line for line in lines if line.startswith("partition-fx: ")]
    assert [line.split(" | ")[0] for line in progress] == [
        f"partition-fx: {arm} {what}"
        for arm in ("partitioned", "baseline")
        for what in ("run", "round 1/2", "round 2/2")
    ], log
    assert "test accuracy" in progress[1] and "MB up+down" in progress[1] and "rotation" in progress[1]
    assert lines[len(progress)].startswith("federated, 2 rounds: test accuracy") and len(lines) == len(progress) + 5
    assert lines[-2].startswith("psi learned nothing in 2 rounds")  # two rounds are too few: the one line saying so


def test_flower_logging_keeps_flowers_log_to_warnings_while_a_run_lasts(monkeypatch) -> None:
    """``flower_logging`` (what ``run_flower`` runs in): Flower's INFO and its own deprecation notices left out,
    warnings kept, no colour codes on a stream that is not a terminal; all restored after. ``True``, or
    ``FLWR_LOG_LEVEL`` set, keeps Flower's log as it is."""
    pytest.importorskip("flwr", reason=FLOWER)
    import io
    import logging

    from flwr.common.logger import ConsoleHandler, log, warn_deprecated_feature

    from partition_fx.federated.flower import flower_logging

    flower = logging.getLogger("flwr")
    stream = io.StringIO()
    handler = ConsoleHandler(colored=True, stream=stream)
    flower.addHandler(handler)
    level, filters = flower.level, list(flower.filters)
    monkeypatch.delenv("FLWR_LOG_LEVEL", raising=False)
    try:
        with flower_logging():
            log(logging.INFO, "[ROUND 1/2]")
            warn_deprecated_feature("The `run_simulation` function is deprecated")
            log(logging.WARNING, "round 1: 1 client(s) failed")
        assert stream.getvalue().splitlines() == ["WARNING :   round 1: 1 client(s) failed"]
        assert (flower.level, flower.filters, handler.colored) == (level, filters, True)
        for show, env in ((True, None), (None, "INFO")):
            stream.truncate(0)
            stream.seek(0)
            if env:
                monkeypatch.setenv("FLWR_LOG_LEVEL", env)
            with flower_logging(show):
                log(logging.INFO, "[ROUND 1/2]")
            assert stream.getvalue() == "INFO :      [ROUND 1/2]\n", (show, env)
    finally:
        flower.removeHandler(handler)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--alpha", "0"], "--alpha 0.0: the Dirichlet concentration must be > 0"),
        (["--clients", "5000"], "--clients 5000: more clients than the"),
        (["--clients", "4"], "leave chunk 3 without a client"),
        (["--proportions", "0.5,0.5"], "--partitions 3 --proportions 0.5,0.5: proportions has 2 entries"),
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
    from partition_fx.cli import main

    for name in ("flwr", "flwr.simulation"):
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    out = tmp_path / "never"
    assert main(["federated", "--clients", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "federated training needs flwr, which is not installed: pip install 'partition-fx[federated]'" in err
    assert "\n" not in err.strip() and not out.exists()


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_alpha_has_one_check_for_the_library_and_the_command_line(alpha) -> None:
    """dirichlet_split, plan_clients (through it) and the command line refuse the same values by one check
    (``_validation.check_concentration``), the command line naming --alpha; inf too, which numpy turned into NaN
    probabilities."""
    from partition_fx.cli.commands.federated import federated_config
    from partition_fx.cli.parser import build_parser
    from partition_fx.datasets import digits
    from partition_fx.federated.job import plan_clients

    with pytest.raises(PartitionArgumentError, match="alpha must be > 0 and finite"):
        dirichlet_split(torch.arange(20) % 4, 4, alpha)
    with pytest.raises(PartitionArgumentError, match="alpha must be > 0 and finite"):
        plan_clients(digits(size=8), 10, alpha, (0.7, 0.2, 0.1))
    args = build_parser().parse_args(["federated", f"--alpha={alpha}"])
    with pytest.raises(PartitionArgumentError, match="^" + re.escape(f"--alpha {alpha}: the Dirichlet concentration")):
        federated_config(args)


def test_federated_options_parse_and_default_as_trains(capsys) -> None:
    """--proportions and --seed go through the shared parsers (train's refusals), and --proportions left out
    means the default shares with 3 partitions and equal shares with any other, as train's help says."""
    from partition_fx.cli.commands.federated import federated_config
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

    assert federated_config(parse()).proportions == (0.7, 0.2, 0.1)
    assert federated_config(parse("--partitions", "4")).proportions == (0.25, 0.25, 0.25, 0.25)
    assert federated_config(parse("--partitions", "2", "--proportions", "0.6,0.4")).proportions == (0.6, 0.4)
    with pytest.raises(PartitionArgumentError, match=r"^--partitions 300: num_partitions must be <= 255"):
        federated_config(parse("--partitions", "300"))
    with pytest.raises(PartitionArgumentError, match=r"^--proportions must all be > 0 \(every chunk needs clients\)"):
        federated_config(parse("--proportions", "0.9,0.1,0"))
    sub = build_parser()._subparsers._group_actions[0].choices["federated"]
    [proportions] = [a for a in sub._actions if a.dest == "proportions"]
    assert proportions.help.endswith(
        "(default: 0.7,0.2,0.1 with 3 partitions, equal shares with any other --partitions)"
    )


FAILING_CLIENT = '''"""The shipped client, except that clients 0 and 1 fail in every round they are sampled."""
from flwr.clientapp import ClientApp

from partition_fx.federated.app import client_evaluate, client_train

app = ClientApp()


@app.train()
def train(message, context):
    if int(context.node_config["partition-id"]) in (0, 1):
        raise RuntimeError("this client fails on purpose")
    return client_train(message, context)


@app.evaluate()
def evaluate(message, context):
    return client_evaluate(message, context)
'''


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_processes_mentioning(text: str) -> None:
    """Stop the local SuperLink ``flwr run`` left running (and anything else started under ``text``)."""
    import os
    import signal
    from pathlib import Path

    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def test_flwr_run_starts_the_shipped_app_with_client_sampling_and_a_failing_client(tmp_path) -> None:
    """``flwr run`` (Flower's own command, through a local SuperLink) on the shipped app, 3 rounds over 5
    simulated SuperNodes sampling 80% of them per round (4), with clients 0 and 1 failing whenever sampled
    (so every round has a failure, and at least 2 replies): every round completes, the failures are logged
    and kept, and the server writes the run's history and model."""
    pytest.importorskip("flwr", reason=FLOWER)
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    app = tmp_path / "app"
    shutil.copytree(root / "examples" / "flower_app", app)
    toml = (app / "pyproject.toml").read_text()
    (app / "pyproject.toml").write_text(toml.replace("partition_fx.federated.app:client_app", "failing_client:app"))
    (app / "failing_client.py").write_text(FAILING_CLIENT)
    out, home = tmp_path / "out", tmp_path / "flwr-home"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # partition-fx is installed here, not on an index
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),  # beside any other SuperLink on this machine
        "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
        "FLWR_TELEMETRY_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    run_config = (f"num-rounds=3 fraction-train=0.8 fraction-evaluate=0.4 image-size=8 samples=2 test-samples=2 "
                  f"evaluate-every=1 data='digits' proportions='0.6,0.2,0.2' out='{out}'")  # fmt: skip
    command = [str(Path(bin_dir) / "flwr"), "run", str(app), "--stream", "--run-config", run_config,
               "--federation-config", "num-supernodes=5"]  # fmt: skip
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    finally:
        _stop_processes_mentioning(str(home))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert log.count("configure_train: Sampled 4 nodes (out of 5)") == 3, log[-3000:]
    assert "this client fails on purpose" in log and "Strategy execution finished" in log
    history = json.loads((out / "history.json").read_text())
    assert [p["round"] for p in history["curve"]] == [1, 2, 3] and (out / "model.safetensors").is_file()
    for r in ("1", "2", "3"):
        failed = len([f for f in history["failures"][r] if f.startswith("train: ")])
        trained = len(history["client_train_metrics"][r])
        assert all(f.endswith("this client fails on purpose'>") for f in history["failures"][r])
        assert failed >= 1 and trained >= 2 and failed + trained == 4, (r, failed, trained)
        assert {c["client"] for c in history["client_train_metrics"][r]}.isdisjoint({0.0, 1.0})
    assert set(history["federated_evaluation"]) == {"1", "2", "3"}


def test_federated_print_config_and_config_file_round_trip(tmp_path, capsys) -> None:
    """``--print-config`` writes the whole run; ``--config`` reads it back as the defaults, options given override
    it, and a key the run does not have is refused naming the known ones."""
    from partition_fx.cli import main
    from partition_fx.cli.commands.federated import federated_config
    from partition_fx.cli.parser import build_parser

    assert main(["federated", "--rounds", "7", "--proportions", "0.6,0.4", "--partitions", "2", "--print-config"]) == 0
    path = tmp_path / "fed.yaml"
    path.write_text(capsys.readouterr().out)
    args = build_parser().parse_args(["federated", "--config", str(path), "--alpha", "0.5"])
    config = federated_config(args)
    assert (config.rounds, config.proportions, config.alpha) == (7, (0.6, 0.4), 0.5)
    path.write_text("roundz: 3\n")
    with pytest.raises(SystemExit) as refused:
        main(["federated", "--config", str(path), "--print-config"])
    assert refused.value.code == 2
    assert "unknown key(s) roundz at the top level (did you mean rounds?); it takes data, image_size" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("size", [4, 10, 6])
def test_the_command_and_the_config_refuse_an_image_size_alike(size, capsys) -> None:
    """One check: ``FederatedConfig``'s own, which the command's options go through (named by the option)."""
    from partition_fx.cli import main
    from partition_fx.federated.config import FederatedConfig
    from partition_fx.job.settings import SettingError

    with pytest.raises(SettingError) as refused:
        FederatedConfig(image_size=size)
    assert main(["federated", "--image-size", str(size), "--out", "never"]) == 2
    assert capsys.readouterr().err.strip() == f"partition-fx: error: --image-size {refused.value.problem}"
