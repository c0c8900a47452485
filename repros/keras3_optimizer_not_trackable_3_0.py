"""Known deviation keras3-optimizer-not-trackable-3.0 (see known_deviations.toml).

The custom-training tutorial (and the distributed custom-training guide) checkpoints the model and
the optimizer with tf.train.Checkpoint(optimizer=optimizer, model=model). tf.train.Checkpoint
accepts only Trackable objects (checkpoint.py: _assert_trackable). Keras 3.0's TensorFlow
optimizer (keras/src/backend/tensorflow/optimizer.py: class TFOptimizer(BaseOptimizer)) is not
one: the Checkpoint's constructor raises ValueError "`Checkpoint` was expecting optimizer to be a
trackable object". keras-team/keras issue 19321; commit c1dfba3 "Fix TF Checkpoint support in
optimizer" makes it TFOptimizer(KerasAutoTrackable, BaseOptimizer), as the keras 3.1.0 wheel on
PyPI already has it (measured: 3.1.0 and 3.1.1 with TF 2.16.2 save and restore the optimizer).
Run: python this_file.py (prints what it sees; exit 1 where the Checkpoint cannot be made or
does not restore the optimizer's state)
"""

import sys
import tempfile

import keras
import tensorflow as tf

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam()
optimizer.build(model.trainable_variables)
try:
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
except ValueError as exc:
    print(f"Keras {keras.__version__}: tf.train.Checkpoint(optimizer=..., model=...) raised "
          f"ValueError: {str(exc)[:90]}...; expected a checkpoint")
    sys.exit(1)
optimizer.iterations.assign(7)
path = checkpoint.save(tempfile.mkdtemp() + "/ckpt")
optimizer.iterations.assign(0)
checkpoint.restore(path)
restored = int(optimizer.iterations.numpy())
print(f"Keras {keras.__version__}: checkpoint saved and restored, optimizer.iterations {restored} (expected 7)")
sys.exit(0 if restored == 7 else 1)
