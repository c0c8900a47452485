"""tf-distribute-suite: the harness (pytest side imports no TensorFlow)."""
