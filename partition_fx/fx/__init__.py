"""The fx pass: a model rewritten into its partitioned equivalent (:func:`~partition_fx.fx.rewrite.partitionify`).

One phase per module, torch.ao's FX quantization's shape: ``tracing`` (the model's graph, or why there is none),
``treatment`` (what happens to each parameter), ``config`` (the conversion's settings and per-parameter rules),
``kinds`` (how a tensor is split into partitions), ``assign`` (which entries each partition holds), ``params``
(the partitioned tensors), ``flat`` (their storage), ``regenerated`` (defaults regenerated from the seed),
``rewrite`` (the pass itself), ``runtime`` (what the rewritten graph calls), ``partitioned_model`` (the module it
returns) and ``records`` (how each tensor was treated). ``partition_fx.partitionify`` is the façade.

Importing this package imports nothing: ``kinds`` is read by the command line before torch loads.
"""
