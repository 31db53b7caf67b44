"""The loop: ``fit`` and ``PartitionedTrainer`` (the run, its state, ``FitResult``), what a run is given besides its
recipe (``components``), the hook protocol and its policies (``hooks``), the progress lines (``progress``) and a
population of runs compared by the evidence (``population``)."""
