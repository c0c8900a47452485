"""A GAN trained with a custom loop in the shape of TensorFlow's DCGAN tutorial, distributed as the
custom-training tutorial distributes a loop: two models, two optimizers, two tapes, the losses
scaled by the global batch; ``--case NAME`` picks it right or with one mistake.

    tf-distribute-check examples/scripts/gan.py --strategies mirrored:2 -- --case generator_loss_averaged_per_replica

Each mistake's case names the model and the cause the check must give; the cases starting
``right`` train what one device trains. The noise the generator is fed is drawn ahead, in the
dataset, not inside the step: a step that draws its own random numbers draws other numbers on each
replica than on one device, and its runs cannot be compared (the check says RANDOM, never FAIL).
Small dense models on generated data (nothing is downloaded), 16 examples per replica.
"""

import argparse

import numpy as np
import tensorflow as tf

CASES = ("right", "right_two_discriminator_steps", "generator_loss_averaged_per_replica",
         "discriminator_loss_averaged_per_replica", "generator_reduce_mean_for_sum",
         "discriminator_gradients_aggregated_by_hand", "generator_optimizer_outside_scope",
         "discriminator_regularization_not_scaled", "generator_fed_fixed_noise")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="right")
parser.add_argument("--epochs", type=int, default=2)
case = parser.parse_args().case

NOISE_DIM, FEATURES = 8, 12
rng = np.random.default_rng(5)
real_images = rng.normal(loc=1.0, size=(256, FEATURES)).astype(np.float32)
noise = rng.normal(size=(256, NOISE_DIM)).astype(np.float32)

strategy = tf.distribute.MirroredStrategy()
BATCH_SIZE_PER_REPLICA = 16
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
dataset = tf.data.Dataset.from_tensor_slices((real_images, noise)).batch(GLOBAL_BATCH_SIZE, drop_remainder=True)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
# generator_fed_fixed_noise: one noise tensor, sliced to each replica's rows, in place of the batch's noise: every
# replica feeds its generator the same first rows (a mistake no catalogued cause describes; its generator's loss
# reads no example, so equal losses on every worker prove nothing about the input's sharding: issue 62, finding 4)
FIXED_NOISE = tf.constant(noise[:GLOBAL_BATCH_SIZE])


def make_generator_model():
    return tf.keras.Sequential([tf.keras.layers.Input((NOISE_DIM,)), tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(FEATURES)], name="generator")


def make_discriminator_model():
    regularizer = tf.keras.regularizers.L2(1e-2) if case == "discriminator_regularization_not_scaled" else None
    return tf.keras.Sequential([tf.keras.layers.Input((FEATURES,)),
                                tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
                                tf.keras.layers.Dense(1, kernel_regularizer=regularizer)], name="discriminator")


if case == "generator_optimizer_outside_scope":
    generator_optimizer = tf.keras.optimizers.Adam(1e-3)
with strategy.scope():
    generator = make_generator_model()
    discriminator = make_discriminator_model()
    if case != "generator_optimizer_outside_scope":
        generator_optimizer = tf.keras.optimizers.Adam(1e-3)
    discriminator_optimizer = tf.keras.optimizers.Adam(1e-3)
    discriminator_optimizer.build(discriminator.trainable_variables)
    if case != "generator_optimizer_outside_scope":
        generator_optimizer.build(generator.trainable_variables)
    cross_entropy = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
if case == "generator_optimizer_outside_scope":
    generator_optimizer.build(generator.trainable_variables)


def scaled(per_example_loss, averaged_per_replica=False):
    if averaged_per_replica:  # the mean of this replica's examples only
        return tf.reduce_mean(per_example_loss)
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)


def discriminator_loss(real_output, fake_output):
    per_example = (cross_entropy(tf.ones_like(real_output), real_output)
                   + cross_entropy(tf.zeros_like(fake_output), fake_output))
    return scaled(per_example, averaged_per_replica=case == "discriminator_loss_averaged_per_replica")


def generator_loss(fake_output):
    return scaled(cross_entropy(tf.ones_like(fake_output), fake_output),
                  averaged_per_replica=case == "generator_loss_averaged_per_replica")


def train_discriminator(images, generated):
    with tf.GradientTape() as disc_tape:
        real_output = discriminator(images, training=True)
        fake_output = discriminator(generated, training=True)
        disc_loss = discriminator_loss(real_output, fake_output)
        if discriminator.losses:  # added whole by every replica (not scale_regularization_loss)
            disc_loss += tf.add_n(discriminator.losses)
    gradients = disc_tape.gradient(disc_loss, discriminator.trainable_variables)
    if case == "discriminator_gradients_aggregated_by_hand":  # summed here, and again by apply_gradients
        context = tf.distribute.get_replica_context()
        gradients = [context.all_reduce(tf.distribute.ReduceOp.SUM, g) for g in gradients]
    discriminator_optimizer.apply_gradients(zip(gradients, discriminator.trainable_variables))
    return disc_loss


def train_step(inputs):
    images, noise = inputs
    if case == "generator_fed_fixed_noise":
        noise = FIXED_NOISE[:tf.shape(images)[0]]
    generated = generator(noise, training=True)
    disc_loss = train_discriminator(images, generated)
    if case == "right_two_discriminator_steps":  # the discriminator trained twice per generator step
        disc_loss = train_discriminator(images, generated)
    with tf.GradientTape() as gen_tape:
        fake_output = discriminator(generator(noise, training=True), training=True)
        gen_loss = generator_loss(fake_output)
    gradients_of_generator = gen_tape.gradient(gen_loss, generator.trainable_variables)
    generator_optimizer.apply_gradients(zip(gradients_of_generator, generator.trainable_variables))
    return gen_loss, disc_loss


@tf.function
def distributed_train_step(inputs):
    gen_losses, disc_losses = strategy.run(train_step, args=(inputs,))
    # the generator's loss reported as the mean of the replicas' shares of it (a mistake), not their sum
    generator_op = tf.distribute.ReduceOp.MEAN if case == "generator_reduce_mean_for_sum" else tf.distribute.ReduceOp.SUM
    return (strategy.reduce(generator_op, gen_losses, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, disc_losses, axis=None))


for epoch in range(parser.parse_args().epochs):
    for batch in dist_dataset:
        gen_loss, disc_loss = distributed_train_step(batch)
    print(f"epoch {epoch + 1}: generator loss {float(gen_loss):.4f}, discriminator loss {float(disc_loss):.4f}")
