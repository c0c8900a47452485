"""Known deviation keras3-fit-loss-tracker-counts-each-step-before-3.2 (see known_deviations.toml).

Keras 3.0-3.1's TensorFlow trainer updates fit's loss tracker (a Mean) with each step's loss and
no sample weight, so each step counts as one example whatever its rows: fit's logged loss is the
mean of the batches' losses, not of the examples' (keras-team/keras PR 19363, first in 3.2.0,
passes the batch size). Under MirroredStrategy each replica's tracker is its own copy (Keras
3.0-3.6), and a replica that a batch leaves no rows adds its loss, 0 / 0 = NaN (Keras 3.0-3.6,
keras3-loss-nan-on-empty-replica-before-3.7), counted as one: the logged loss is NaN from then on.
Keras 3.2+ weigh the update by the rows, so a replica that never had rows counts nothing.
Run: python this_file.py (prints the logged losses; exit 1 where they deviate)
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
import keras  # noqa: E402
import numpy as np  # noqa: E402


def logged(strategy, x, y, batch):
    """fit's logged loss after each batch of one epoch, the weights frozen (no step moves them)."""
    with strategy.scope():
        inputs = keras.Input((1,))
        model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="zeros", use_bias=False)(inputs))
        model.trainable = False
        model.compile("sgd", "mse")
    logs = []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs=None, out=logs: out.append(float(logs["loss"])))
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), epochs=1, verbose=0, callbacks=[callback])
    return logs


# one device, a batch of 3 and one of 1, the prediction 0: the examples' losses 1, 1, 1 and 9, so after
# both batches the mean over the examples is 12 / 4 = 3 (the mean of the batches' means would be 5)
x = np.zeros((4, 1), "float32")
y = np.array([[1.0], [1.0], [1.0], [3.0]], "float32")
one = logged(tf.distribute.OneDeviceStrategy("/cpu:0"), x, y, 3)
ok_one = abs(one[-1] - 3.0) < 1e-6
print(f"Keras {keras.__version__}, one device, batches of 3 and 1: logged {one} (expected [1.0, 3.0])"
      f"{'' if ok_one else '  DEVIATES'}")
# three replicas, a batch of 4 split [2, 2, 0], every example's loss 1: one device logs 1; whatever the
# replicas' trackers are reduced with (the sum on 3.0-3.2, the mean on 3.3-3.6, other entries), a finite log
# unless a tracker counted the empty replica's 0 / 0 (Keras 3.6+ raise from AddN here instead:
# keras3-fit-uneven-replica-batches-raise)
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
try:
    three = logged(mirrored, np.zeros((4, 1), "float32"), np.ones((4, 1), "float32"), 4)
except tf.errors.InvalidArgumentError as exc:
    three = []
    print(f"Keras {keras.__version__}, mirrored:3: fit raised {str(exc).splitlines()[0][:100]} (another entry)")
ok_three = all(np.isfinite(three))
if three:
    print(f"Keras {keras.__version__}, mirrored:3, a batch of 4 (split [2, 2, 0]): logged {three}"
          f"{'' if ok_three else '  DEVIATES (NaN: the empty replica counted its 0 / 0)'}")
raise SystemExit(int(not (ok_one and ok_three)))
