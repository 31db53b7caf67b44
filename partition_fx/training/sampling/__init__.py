"""The data and its sampling: chunks, examples and the sampler (``chunks``), the run's timeline and your loop's batch
sampler (``schedule``), and what each iteration draws (``schemes``)."""
