"""Golden outputs: small fixed-seed jobs of ``fit`` and of ``partition-fx train``/``export``/``convert`` compute
today exactly what they computed when ``tests/golden/data`` was written, bit for bit.

Each job (``tests/golden/generate.py``, ``JOBS``) runs again here on the CPU with one thread and is compared with
its stored outputs: every tensor of every ``.safetensors`` file it writes (checkpoints, ``resume/``, exported
models) and of the model it returns is ``torch.equal`` with the same dtype and shape; every record (the
``FitResult`` as data, reports, ``run.json``, ``state.json``, safetensors metadata, ONNX metadata and initializer
digests, stdout, directory listings) is equal, with wall-clock and version fields dropped and the temporary
directory written ``<tmp>``. The resume jobs resume from the stored ``resume/`` directory (written by a run stopped
early) and must finish equal to the stored uninterrupted run. A failure names the job and the first difference.

The files were generated at commit e0df00f and every job's again when learned ranges began to start wide
(``AffineAugmentation(init="wide")``) with parameter steps trained on 0.75 of them (``train_range_factor``): with those
two defaults put back (``init="zero"``, ``train_range_factor=1.0``) every job still computed the earlier files bit for
bit. Every job's files were written again when the hyperparameter step was cut to the run (6 augmentation samples
instead of 16, drawn stratified, parameter steps on half the ranges instead of 0.75): with those three defaults put back
every job still computed the earlier files bit for bit. The ``.safetensors`` files were written again when
``AffineAugmentation``'s state began to name its generators (``hyper/generator_ids``, added; every other tensor
unchanged). ``cli_train_export``'s record was edited by hand when reports began to record the trackers (``log``), the
training images' ``input_statistics`` and the package ``version`` (stripped, as torch's), the preprocessing's ``steps``
began to say how deep and transparent images decode, and ``export``'s summary began to say where it wrote: those fields
were added or rewritten on an AVX-512 machine (they do not depend on the CPU: the statistics are computed in float64 and
rounded), every other value kept as the AVX2 machine wrote it. The hyper-gradient's settings joined the training
configuration and the resume fingerprint (``hyper_gradient`` ``fixed``, ``implicit_terms`` 5, ``implicit_lr`` 0.01) and
were added to every record that holds either the same way, by hand, and so was ``max_range`` (null, the default bounds)
to the job's config when ``--max-range`` joined it, and ``train_range_factors`` (null, every range widened alike) to
every record's training configuration when per-range factors joined it, and the population's settings (``population`` 1,
``population_interval`` 20, ``population_exploit`` 0.5, ``population_delta`` 0.5, ``population_floor`` 0.05) to every
training configuration and resume fingerprint, with ``population: null`` to every ``FitResult``, when populations joined
``fit`` (a single run's computation untouched: the fields only record that it is one); and
``fit_patience_restore_best``'s resume state gained ``partitioned_ended_at`` (4) by hand when the run's patience began
to be saved with it (the run's schedule), every tensor and every other value unchanged on an AVX-512 machine. Two
changes made while the test skipped on AVX-512 machines were added by hand on an AVX2 one, every tensor and every other
value checked unchanged there: ``train``'s summary giving the data's sizes (``cli_train_export``'s stdout) and an image
folder's record of its skipped non-image files (``fit_folder_workers0``/``2``, ``skipped_files``: none). Before that,
``cli_train_export``'s record was written again four times, each time with every tensor and every other value unchanged:
when hooks got state of their own (its report's history no longer carries ``partitioned_test_accuracy``), when
``generators`` and ``draws`` joined the job (its report's config gains them at their defaults, ``xy`` and ``uniform``),
when ``hyper_norm`` joined the training configuration (``config.train.hyper.norm_statistics``: ``batch``), and when the
summaries of ``train`` and ``export`` began to lead with the accuracy averaged over the augmentation (their stdout). A
later change that alters a trajectory or an output on purpose regenerates them with ``python -m tests.golden.generate``
(from the repository root; ``--jobs NAME ...`` for some) and says in its commit message why they changed. Results are
bit-exact only for one build of torch on one kind of CPU: where ``data/environment.json`` names another (torch, CPU
capability, numpy, onnx, ...), the test skips.
"""

from __future__ import annotations

import pytest
from golden import generate


@pytest.fixture(scope="module")
def same_environment() -> None:
    changed = generate.environment_difference()
    if changed:
        pytest.skip(f"tests/golden/data was computed elsewhere ({changed}); regenerate it to compare here")


@pytest.mark.parametrize("name", list(generate.JOBS))
def test_job_computes_what_it_computed_when_the_golden_files_were_written(name, tmp_path, same_environment) -> None:
    capture = generate.run_job(name, tmp_path)
    difference = generate.first_difference(name, capture)
    assert difference is None, f"golden job {name!r} differs from tests/golden/data/{name}: {difference}"


def test_every_job_has_its_golden_files() -> None:
    stored = sorted(p.name for p in generate.DATA.iterdir() if p.is_dir())
    assert stored == sorted(generate.JOBS), "regenerate with python -m tests.golden.generate"
