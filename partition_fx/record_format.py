"""The format of a trained model's record: what using an exported model needs beyond its weights, as
``report.json``, ``export.json`` and the ONNX file's metadata hold it (``jobs.model_record`` writes it, ``partition-fx
predict`` reads it), and the names of the ONNX file's input and output.

No torch here: ``predict`` checks a record before torch loads.

>>> MODEL_RECORD, ONNX_INPUT, ONNX_OUTPUTS[True]
(('classes', 'preprocessing', 'architecture', 'onnx_names'), 'images', 'log_probs')
"""

from __future__ import annotations

MODEL_RECORD = ("classes", "preprocessing", "architecture", "onnx_names")
"""What using an exported model needs beyond its weights, recorded with it (``jobs.model_record``) in
``report.json``, ``export.json`` and the ONNX file's metadata, and read by ``predict``."""
CHECKS_RECORD = ("input_statistics",)
"""What a model record may hold beyond :data:`MODEL_RECORD` (earlier versions did not write it): the training
images' statistics ``predict`` compares new images with."""
ONNX_INPUT = "images"
"""The input of every ONNX file ``train`` and ``export`` write: a float32 NCHW batch, as ``preprocessing`` says."""
ONNX_OUTPUTS = {False: "logits", True: "log_probs"}
"""Their output: the plain model's logits, or the test-time-averaged model's log-probabilities (by ``averaged``)."""
