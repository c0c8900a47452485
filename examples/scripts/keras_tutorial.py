"""TensorFlow's tutorial "Distributed training with Keras" (tensorflow/docs, site/en/tutorials/distribute/keras.ipynb),
its cells as one script, Keras 2 (tf-keras) code as published: MirroredStrategy, a small CNN compiled in the
scope, Model.fit with TensorBoard, ModelCheckpoint, LearningRateScheduler and a callback printing the learning
rate, then the latest checkpoint restored with load_weights, an evaluate and the model saved. MNIST from
tensorflow_datasets is replaced by generated images and labels of its shapes (nothing is downloaded).

Its fit is what the check compares; what follows it (load_weights, evaluate, save) never runs in the check
(issue 63: on tf-keras engines the run once went on to load_weights and was reported as fit's raise).
Run with tf-keras engines: ``--engine-python .tox/tf221-legacy/bin/python`` and ``TF_USE_LEGACY_KERAS=1``.
"""
import os

import numpy as np
import tensorflow as tf

# in place of tfds.load('mnist', with_info=True, as_supervised=True)
rng = np.random.default_rng(0)
images = rng.integers(0, 256, size=(1024, 28, 28, 1)).astype(np.uint8)
labels = rng.integers(0, 10, size=(1024,)).astype(np.int64)
mnist_train = tf.data.Dataset.from_tensor_slices((images, labels))
mnist_test = tf.data.Dataset.from_tensor_slices((images[:256], labels[:256]))

strategy = tf.distribute.MirroredStrategy()
print('Number of devices: {}'.format(strategy.num_replicas_in_sync))

num_train_examples = len(images)
num_test_examples = 256
BUFFER_SIZE = 10000
BATCH_SIZE_PER_REPLICA = 64
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync


def scale(image, label):
    image = tf.cast(image, tf.float32)
    image /= 255
    return image, label


train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(),
                  metrics=['accuracy'])

checkpoint_dir = './training_checkpoints'
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch}")


def decay(epoch):
    if epoch < 3:
        return 1e-3
    elif epoch >= 3 and epoch < 7:
        return 1e-4
    else:
        return 1e-5


class PrintLR(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print('\nLearning rate for epoch {} is {}'.format(epoch + 1, model.optimizer.lr.numpy()))


callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir='./logs'),
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
    PrintLR()
]

EPOCHS = 12
model.fit(train_dataset, epochs=EPOCHS, callbacks=callbacks)

model.load_weights(tf.train.latest_checkpoint(checkpoint_dir))
eval_loss, eval_acc = model.evaluate(eval_dataset)
print('Eval loss: {}, Eval accuracy: {}'.format(eval_loss, eval_acc))

path = 'saved_model/'
model.save(path, save_format='tf')
