"""The synthetic regression task of the paper's input-selection experiment (:func:`input_selection`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.data import TensorDataset

from .._validation import check_int
from ..errors import PartitionArgumentError
from .splits import (
    FUNCTION_STREAM,
    TEST_INPUT_STREAM,
    TEST_NOISE_STREAM,
    TRAIN_INPUT_STREAM,
    TRAIN_NOISE_STREAM,
    DatasetSplits,
    Split,
    check_split,
    only_split,
    seeded_rng,
)

_NUM_SINES = 16  # terms of the input-selection target function


def _input_selection_function(num_informative: int, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The noiseless target f: (N, D) -> (N,), reading only the first ``num_informative`` columns.

    ``f(x) = sqrt(2 / J) * sum_j sin(w_j . x[:k] + b_j)`` with J = 16, ``w_j ~ N(0, I_k / k)`` (so each
    projection has unit variance under x ~ N(0, I): smooth, a few bends per input) and ``b_j ~ U[0, 2 pi)``;
    each term has variance about 1/2, hence the scale makes Var f about 1.

    >>> f = _input_selection_function(1, seed=0)
    >>> x = torch.zeros(2, 3)
    >>> x[1, 1:] = 5.0  # the uninformative inputs do not matter
    >>> bool(f(x)[0] == f(x)[1])
    True
    """
    rng = seeded_rng(seed, FUNCTION_STREAM)
    weights = torch.from_numpy(rng.normal(0.0, 1.0 / math.sqrt(num_informative), (num_informative, _NUM_SINES)))
    phases = torch.from_numpy(rng.uniform(0.0, 2 * math.pi, _NUM_SINES))
    scale = math.sqrt(2.0 / _NUM_SINES)

    def f(x: torch.Tensor) -> torch.Tensor:
        informative = x[:, :num_informative].double()  # float64 so f does not depend on the batch's rounding
        return (scale * torch.sin(informative @ weights + phases).sum(1)).float()

    return f


def input_selection(
    num_train: int = 3000,
    num_test: int = 1000,
    num_informative: int = 3,
    num_inputs: int = 10,
    noise: float = 0.1,
    seed: int = 0,
    split: Split | None = None,
) -> DatasetSplits:
    """Synthetic regression where only the first ``num_informative`` of ``num_inputs`` inputs matter.

    ``x ~ N(0, I_num_inputs)``, ``y = f(x[:num_informative]) + noise * eps`` with ``eps ~ N(0, 1)`` and f a
    fixed (per ``seed``) random sum of 16 sines of unit-variance random projections, scaled to variance about
    1. The paper's appendix (I.5) gives only the sizes (3000 train, a fresh 1000 for test); the generative
    process here is this package's. Train and test are independent samples; x and the noise come from
    separate streams, so a smaller ``num_train`` gives a prefix of a larger one. Targets have shape (N, 1).
    ``info`` holds ``informative`` (input indices), ``noise`` and the noiseless ``train_clean``/``test_clean``.
    ``split="train"`` or ``"test"`` draws that split alone (the same tensors); the other is left empty.

    >>> splits = input_selection(num_train=50, num_test=20)
    >>> tuple(splits.train.tensors[0].shape), tuple(splits.test.tensors[1].shape), splits.info["informative"]
    ((50, 10), (20, 1), [0, 1, 2])
    """
    num_train = check_int("num_train", num_train, 1, noun="an integer")
    num_test = check_int("num_test", num_test, 1, noun="an integer")
    num_informative = check_int("num_informative", num_informative, 1, noun="an integer")
    num_inputs = check_int("num_inputs", num_inputs, 1, noun="an integer")
    if num_informative > num_inputs:
        raise PartitionArgumentError(
            f"num_informative ({num_informative}) must be at most num_inputs ({num_inputs}); "
            "raise num_inputs or lower num_informative"
        )
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not math.isfinite(noise) or noise < 0:
        raise PartitionArgumentError(f"noise must be a finite standard deviation >= 0 (e.g. 0.1), got {noise!r}")
    seed = check_int("seed", seed, 0, noun="an integer")
    split = check_split(split)
    f = _input_selection_function(num_informative, seed)

    def sample(count: int, input_stream: int, noise_stream: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(seeded_rng(seed, input_stream).standard_normal((count, num_inputs))).float()
        clean = f(x)
        eps = torch.from_numpy(seeded_rng(seed, noise_stream).standard_normal(count)).float()
        return x, (clean + float(noise) * eps).unsqueeze(1), clean.unsqueeze(1)

    train_x, train_y, train_clean = sample(num_train, TRAIN_INPUT_STREAM, TRAIN_NOISE_STREAM)
    test_x, test_y, test_clean = sample(num_test, TEST_INPUT_STREAM, TEST_NOISE_STREAM)
    both = DatasetSplits(
        train=TensorDataset(train_x, train_y),
        test=TensorDataset(test_x, test_y),
        num_classes=None,
        input_shape=(num_inputs,),
        name="input_selection",
        description=(
            f"synthetic regression: x ~ N(0, I_{num_inputs}), y = f(x[:{num_informative}]) + {noise} * N(0, 1), "
            f"f a random sum of {_NUM_SINES} sines (seed {seed}); inputs {num_informative}..{num_inputs - 1} are "
            f"pure noise; {num_train} train / {num_test} test"
        ),
        info={
            "informative": list(range(num_informative)),
            "noise": float(noise),
            "train_clean": train_clean,
            "test_clean": test_clean,
        },
    )
    return only_split(both, split)  # drawing both costs microseconds; each split has its own streams
