"""What a training job is: its settings' declaration (``settings``), the training recipe
(:class:`~partition_fx.job.train_config.TrainConfig`), the job (:class:`~partition_fx.job.spec.JobSpec`) and its
checks together (``checks``), a run's records read back (``records``) and the job built for training (``build``).

The library's layer under the command line: ``partition_fx.cli`` parses argv into a ``JobSpec`` and prints; a
Python script builds the same job from a typed ``JobSpec``. Importing this package imports nothing; every module
but ``build`` is torch-free (the command line refuses bad options before torch loads).
"""
