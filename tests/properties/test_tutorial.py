"""The custom-training tutorial end to end under mirrored:2: train the guide's CNN on
Fashion-MNIST-shaped data, checkpoint every 2 epochs, restore the latest checkpoint into a
fresh model with no strategy, and measure the same test accuracy, well above chance."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np

from reference import input as ref_input
from reference.rules import Rule
from suite.common.given import Given
from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity

# what the stand-in data must look like: the keras.datasets.fashion_mnist.load_data docstring
LOAD_DATA = Rule("documented", "keras.datasets.fashion_mnist.load_data docstring: x_train and x_test 'uint8 NumPy "
                               "array of grayscale image data with shapes' (n, 28, 28), y_train and y_test 'uint8 "
                               "NumPy array of labels (integers in range 0-9)' with shape (n,)")
TUTORIAL = "https://www.tensorflow.org/tutorials/distribute/custom_training"
FLOW = Rule("documented", f"{TUTORIAL}: train the CNN under MirroredStrategy, checkpoint.save every 2 epochs, "
                          "restore tf.train.latest_checkpoint into a new model")
RESTORES = Rule("documented", f"{TUTORIAL}, 'Restore the latest checkpoint and test': 'A model checkpointed with a "
                              "tf.distribute.Strategy can be restored with or without a strategy'")


def test_synthetic_fashion_data_has_the_fashion_mnist_interface(engines):
    """The engine's stand-in data (suite/engine/workloads/fashion.py) has the shapes and dtypes of
    ``fashion_mnist.load_data()`` and is the same on every call."""
    default = parse_spec("default")
    check = Check("fashion.load_data(64, 16)", rule=LOAD_DATA)
    (x_train, y_train), (x_test, y_test) = engines.call(default, "tutorial.load_data", n_train=64, n_test=16)[0]
    check.equal((x_train.shape, x_train.dtype.name), ((64, 28, 28), "uint8"), "training images (shape, dtype)")
    check.equal((x_test.shape, x_test.dtype.name), ((16, 28, 28), "uint8"), "test images (shape, dtype)")
    check.equal((y_train.shape, y_test.dtype.name), ((64,), "uint8"), "labels (shape, dtype)")
    check.that(set(np.unique(y_train)) <= set(range(10)), "training labels", sorted(set(np.unique(y_train).tolist())),
               "classes 0-9")
    again = engines.call(default, "tutorial.load_data", n_train=64, n_test=16)[0]
    check.exact(again[0][0], x_train, "training images of a second call (deterministic)")
    check.exact(again[1][1], y_test, "test labels of a second call (deterministic)")


def test_tutorial_flow_trains_checkpoints_and_restores_without_a_strategy(engines, findings):
    spec = parse_spec("mirrored:2")
    directory = tempfile.mkdtemp(prefix="tfds-tutorial-")
    try:
        trained = engines.call(spec, "tutorial.train", directory=directory, epochs=4, timeout=600)[0]
        restored = engines.call(parse_spec("default"), "tutorial.restore_and_evaluate", directory=directory)[0]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    under, plain = trained.test_accuracy, restored.test_accuracy
    for name, value in (("accuracy under mirrored:2", under), ("restored accuracy", plain)):
        findings.record(f"tutorial {name}", spec, value)
    check = Check(spec, case={"epochs": 4, "history": trained.history}, rule=FLOW)
    check.that(bool(trained.latest) and trained.latest.endswith("ckpt-2"), "latest checkpoint", trained.latest,
               "ckpt-2 (4 epochs with a save every 2)")
    # what the restored model gets right, per test batch and replica (the input rule splits each batch of the
    # global batch size over the replicas): a known deviation's model of the metric state reads it
    correct = np.asarray(restored.correct, np.float64)
    split = ref_input.distribute(len(correct), 64, False, spec.replicas, "AUTO", True, spec.workers)
    per_replica = [(float(sum(correct[i].sum() for i in (s[r] for s in split))),
                    float(sum(len(s[r]) for s in split))) for r in range(spec.replicas)]
    given = Given(kind="accuracy", replica_states=per_replica, replica=0,
                  increments=[(float(sum(correct[p].sum() for p in s)), float(sum(len(p) for p in s))) for s in split])
    Check(spec, "float32", check.case, rule=RESTORES).close(
        under, plain, Quantity.of("test accuracy restored", "test accuracy under the strategy vs test accuracy restored "
                                  "without a strategy"), given=given)
    check.that(under >= 0.5, "test accuracy after 4 epochs", under, "well above chance (0.1): at least 0.5")
