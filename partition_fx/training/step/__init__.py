"""The steps: ``TrainingSteps`` (the one assembly of a run and its parameter, hyperparameter and fine-tuning steps),
the backward pass with its precision, non-finite check and data-parallel averaging (``stepping``), and the
optimisers and schedulers per partition (``optim``)."""
