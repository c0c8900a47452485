"""Names of the Keras classes the probes use, keyed by the suite's short names (no TensorFlow,
so tests can write repro snippets with them and engines can build the objects)."""

LOSS_CLASSES = {
    "mse": ("MeanSquaredError", {}),
    "mae": ("MeanAbsoluteError", {}),
    "sparse_cce_logits": ("SparseCategoricalCrossentropy", {"from_logits": True}),
    "sparse_cce_probs": ("SparseCategoricalCrossentropy", {"from_logits": False}),
    "cce_logits": ("CategoricalCrossentropy", {"from_logits": True}),
    "cce_probs": ("CategoricalCrossentropy", {"from_logits": False}),
    "bce_logits": ("BinaryCrossentropy", {"from_logits": True}),
}

METRIC_CLASSES = {
    "mean": "Mean", "sum": "Sum", "accuracy": "Accuracy", "binary_accuracy": "BinaryAccuracy",
    "sparse_categorical_accuracy": "SparseCategoricalAccuracy",
    "categorical_accuracy": "CategoricalAccuracy",
}
