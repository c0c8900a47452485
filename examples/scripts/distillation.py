"""Knowledge distillation with a custom loop, in the shape of Keras' distillation example, distributed
as the custom-training tutorial distributes a loop: a frozen teacher, a student, one optimizer; the
student's loss mixes the labels' cross-entropy with the KL divergence from the teacher's softened
predictions. ``--case NAME`` picks it right or with one mistake.

    tf-distribute-check examples/scripts/distillation.py --strategies mirrored:2 -- --case student_loss_averaged_per_replica

A case named after a model and a cause is a mistake the check must name so. ``right`` trains what one
device trains; so does ``teacher_trains`` (the teacher's variables handed to the optimizer too), a
mistake of the script but not of its distribution: it trains the teacher alike on one device and on
N, so the check cannot tell it apart (docs/check.md says which mistakes are so).
Small dense models on generated data (nothing is downloaded), 16 examples per replica.
"""

import argparse

import numpy as np
import tensorflow as tf

CASES = ("right", "teacher_trains", "student_loss_averaged_per_replica", "student_regularization_not_scaled",
         "student_created_outside_scope")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="right")
case = parser.parse_args().case

rng = np.random.default_rng(9)
features = rng.normal(size=(256, 10)).astype(np.float32)
labels = rng.integers(0, 5, size=256)
TEMPERATURE, ALPHA = 3.0, 0.3

strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH_SIZE = 16 * strategy.num_replicas_in_sync
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH_SIZE, drop_remainder=True)
dist_dataset = strategy.experimental_distribute_dataset(dataset)


def make_model(name, width, regularizer=None):
    return tf.keras.Sequential([tf.keras.layers.Input((10,)),
                                tf.keras.layers.Dense(width, activation="relu", kernel_regularizer=regularizer),
                                tf.keras.layers.Dense(5, kernel_regularizer=regularizer)], name=name)


if case == "student_created_outside_scope":
    student = make_model("student", 8)
with strategy.scope():
    teacher = make_model("teacher", 32)
    if case != "student_created_outside_scope":
        regularizer = tf.keras.regularizers.L2(1e-2) if case == "student_regularization_not_scaled" else None
        student = make_model("student", 8, regularizer)
    if case != "teacher_trains":
        teacher.trainable = False
    trained = student.trainable_variables + (teacher.trainable_variables if case == "teacher_trains" else [])
    optimizer = tf.keras.optimizers.Adam(1e-2)
    optimizer.build(trained)
    labels_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    distillation_loss = tf.keras.losses.KLDivergence(reduction="none")


def train_step(inputs):
    x, y = inputs
    if case != "teacher_trains":
        teacher_predictions = teacher(x, training=False)
    with tf.GradientTape() as tape:
        if case == "teacher_trains":  # the teacher called in the tape: its variables get gradients too
            teacher_predictions = teacher(x, training=True)
        student_predictions = student(x, training=True)
        per_example = (ALPHA * labels_loss(y, student_predictions)
                       + (1 - ALPHA) * TEMPERATURE ** 2 * distillation_loss(
                           tf.nn.softmax(teacher_predictions / TEMPERATURE, axis=1),
                           tf.nn.softmax(student_predictions / TEMPERATURE, axis=1)))
        if case == "teacher_trains":  # the teacher fitted to the labels as well
            per_example += labels_loss(y, teacher_predictions)
        if case == "student_loss_averaged_per_replica":
            loss = tf.reduce_mean(per_example)
        else:
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
        if student.losses:  # added whole by every replica (not scale_regularization_loss)
            loss += tf.add_n(student.losses)
    gradients = tape.gradient(loss, trained)
    optimizer.apply_gradients(zip(gradients, trained))
    return loss


@tf.function
def distributed_train_step(inputs):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)


for epoch in range(2):
    for batch in dist_dataset:
        loss = distributed_train_step(batch)
    print(f"epoch {epoch + 1}: loss {float(loss):.4f}")
