"""The custom-training tutorial end to end under mirrored:2: train the guide's CNN on
Fashion-MNIST-shaped data, checkpoint every 2 epochs, restore the latest checkpoint into a
fresh model with no strategy, and measure the same test accuracy, well above chance."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np

from suite.common.specs import parse_spec
from suite.harness.check import PropertyFailure


def test_synthetic_fashion_data_has_the_fashion_mnist_interface(engines):
    """The engine's stand-in data (suite/engine/workloads/fashion.py) has the shapes and dtypes of
    ``fashion_mnist.load_data()`` and is the same on every call."""
    default = parse_spec("default")
    (x_train, y_train), (x_test, y_test) = engines.call(default, "tutorial.load_data", n_train=64, n_test=16)[0]
    assert x_train.shape == (64, 28, 28) and x_train.dtype == np.uint8
    assert y_train.shape == (64,) and set(np.unique(y_train)) <= set(range(10))
    assert x_test.shape == (16, 28, 28) and y_test.dtype == np.uint8
    again = engines.call(default, "tutorial.load_data", n_train=64, n_test=16)[0]
    assert np.array_equal(again[0][0], x_train) and np.array_equal(again[1][1], y_test)  # deterministic


def test_tutorial_flow_trains_checkpoints_and_restores_without_a_strategy(engines, findings):
    spec = parse_spec("mirrored:2")
    directory = tempfile.mkdtemp(prefix="tfds-tutorial-")
    try:
        trained = engines.call(spec, "tutorial.train", directory=directory, epochs=4, timeout=600)[0]
        restored = engines.call(parse_spec("default"), "tutorial.restore_and_evaluate", directory=directory)[0]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    under, plain = trained["test_accuracy"], restored["test_accuracy"]
    for name, value in (("accuracy under mirrored:2", under), ("restored accuracy", plain)):
        findings.record(f"tutorial {name}", spec, value)
    if not trained["latest"] or not trained["latest"].endswith("ckpt-2"):
        raise PropertyFailure(f"latest checkpoint {trained['latest']!r}, but 4 epochs with a save every 2 "
                              "should leave ckpt-2 (epoch 4)")
    if plain != under:
        raise PropertyFailure(f"test accuracy {plain} restored without a strategy, but {under} under {spec}")
    if under < 0.5:  # chance is 0.1
        raise PropertyFailure(f"test accuracy {under} after 4 epochs is not well above chance (0.1); "
                              f"history {trained['history']}")
