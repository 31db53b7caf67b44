"""What the summaries of ``train`` and ``export`` say alike: a model's test accuracy and a run's evidence."""

from __future__ import annotations

from typing import Any


def accuracy_text(scores: dict[str, Any], options: dict[str, Any]) -> str:
    """The test accuracy as a summary line says it: the exported model's first (``report.json``'s
    ``test_accuracy``), then, where there is such a score, averaged over the learned augmentation (the predictor
    the LML scores, as the paper reports it; the ``(averaged)`` ONNX model's).

    >>> accuracy_text({"test_accuracy": 0.9651, "averaged_test_accuracy": 0.97123}, {"test_time_samples": 8})
    'test accuracy 0.9651, 0.9712 averaged over 8 transforms of the augmentation'
    >>> accuracy_text({"test_accuracy": 0.9651, "averaged_test_accuracy": None}, {"test_time_samples": 8})
    'test accuracy 0.9651'
    """
    plain = f"test accuracy {scores['test_accuracy']:.4f}"
    if scores.get("averaged_test_accuracy") is None:
        return plain
    return (
        f"{plain}, {scores['averaged_test_accuracy']:.4f} averaged over {options['test_time_samples']} transforms of "
        "the augmentation"
    )


def evidence_text(report: dict[str, Any]) -> str:
    """The run's evidence, the conditional LML (``training.objective.lml.evidence``; ``report.json``'s ``lml_explained``
    says more), or, with one partition, that there is none (``training.objective.lml.NO_EVIDENCE``).

    >>> print(evidence_text({"conditional_lml": -29.3, "conditional_lml_per_example": -0.081, "lml": -2772.1,
    ...                      "lml_per_chunk": [-2742.8, -15.0, -14.3]}))
    evidence: conditional LML -29.3 nats (-0.081/example): chunks 2..3, each scored by a subnetwork not trained on it
    full LML -2772.1 nats, of which -2742.8 is chunk 1 scored by the untrained defaults (see report.json)
    >>> print(evidence_text({"conditional_lml": None, "lml": -2742.8}))
    no evidence with one partition: its LML scores chunk 1 by the untrained defaults, which says nothing about ...
    """
    from ..training.objective.lml import NO_EVIDENCE, evidence

    score = evidence(report)
    if score is None:
        return NO_EVIDENCE
    return (
        f"evidence: conditional LML {score:.1f} nats "
        f"({report['conditional_lml_per_example']:.3f}/example): chunks 2..{len(report['lml_per_chunk'])}, each "
        f"scored by a subnetwork not trained on it\nfull LML {report['lml']:.1f} nats, of which "
        f"{report['lml_per_chunk'][0]:.1f} is chunk 1 scored by the untrained defaults (see report.json)"
    )
