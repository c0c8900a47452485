"""A GAN trained by ``Model.fit`` with a custom ``train_step``, in the shape of the end-to-end GAN of
Keras' guide "Customizing what happens in fit() with TensorFlow": a ``keras.Model`` subclass holding a
discriminator and a generator, ``compile`` overridden to take one optimizer for each, two tapes, the
optimizers' ``apply``, two loss trackers, placed in ``strategy.scope()`` as Keras' distributed-training
guide places a model. ``--case NAME`` picks it right or with one mistake.

    tf-distribute-check examples/scripts/fit_gan.py --strategies mirrored:2 -- --case generator_loss_averaged_per_replica

Where it departs from the guide, and why:

- the latent vectors and the label jitter come in the dataset, not from ``keras.random`` inside the
  step: a step that draws its own random numbers draws other numbers on each replica than on one
  device, and its runs cannot be compared (the check says RANDOM, never FAIL);
- the optimizers are built in the scope (``optimizer.build``), as TensorFlow's custom-training guide
  builds its optimizer; ``optimizers_built_in_the_step`` leaves them to build in fit's first batch, as
  the Keras guide does (under MirroredStrategy with Keras 3.5+ that raises:
  keras3-lazy-optimizer-slots-mirrored);
- ``right`` computes each example's loss (``reduction="none"``), scales it by the global batch
  (``tf.nn.compute_average_loss``) for the gradients and feeds the trackers the examples' losses: what
  one device trains and logs. ``guide_losses`` keeps the guide's losses (``BinaryCrossentropy`` with its
  default reduction) and its trackers, fed the loss the gradients are taken of. From Keras 3.8 a Keras
  loss with that reduction returns the replica's mean divided by the replica count under a strategy
  (its ``reduce_values`` calls ``scale_loss_for_distribution``): the gradients are right, and the
  trackers are fed the loss divided by the replica count. Before Keras 3.8 the loss is not scaled and
  the summed gradients are the replica count's multiple.

The mistakes: ``generator_loss_averaged_per_replica`` (the generator's gradients taken of the mean of
the replica's examples) and ``discriminator_metric_fed_scaled_loss`` (the discriminator's tracker fed
the loss scaled by the global batch).

Keras 3 (the guide's ``optimizer.apply`` and ``LeakyReLU(negative_slope=...)``). Small dense models on
generated data (nothing is downloaded), 16 examples per replica.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

CASES = ("right", "guide_losses", "optimizers_built_in_the_step", "generator_loss_averaged_per_replica",
         "discriminator_metric_fed_scaled_loss")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="right")
parser.add_argument("--epochs", type=int, default=1)
ARGS = parser.parse_args()
case = ARGS.case

# The discriminator and the generator (dense, on 12 features: the guide's are convolutional on MNIST),
# made in the strategy's scope below
FEATURES = 12
latent_dim = 8


def make_discriminator():
    return keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(16),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Dense(1),
        ],
        name="discriminator",
    )


def make_generator():
    return keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            keras.layers.Dense(16),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Dense(FEATURES, activation="sigmoid"),
        ],
        name="generator",
    )


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.built = True  # its parts are: fit would otherwise call it (it has no call) to build it

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def losses_of(self, labels, predictions, averaged_per_replica=False):
        """The loss to take gradients of, and what the tracker is fed."""
        if case == "guide_losses":
            loss = self.loss_fn(labels, predictions)
            return loss, loss
        per_example = self.loss_fn(labels, predictions)
        if averaged_per_replica:  # the mean of this replica's examples only
            return tf.reduce_mean(per_example), per_example
        return tf.nn.compute_average_loss(per_example), per_example

    def train_step(self, data):
        real_images = data["images"]
        latent_d, latent_g, jitter = data["latent_d"], data["latent_g"], data["jitter"]  # the guide's keras.random
        batch_size = tf.shape(real_images)[0]

        # Decode them to fake images
        generated_images = self.generator(latent_d)

        # Combine them with real images
        combined_images = tf.concat([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        # Add random noise to the labels - important trick!
        labels += 0.05 * tf.reshape(tf.transpose(jitter), (-1, 1))

        # Train the discriminator
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss, d_tracked = self.losses_of(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
        if case == "discriminator_metric_fed_scaled_loss":  # the loss scaled by the global batch
            d_tracked = d_loss

        # Assemble labels that say "all real images"
        misleading_labels = tf.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(latent_g))
            g_loss, g_tracked = self.losses_of(misleading_labels, predictions,
                                               averaged_per_replica=case == "generator_loss_averaged_per_replica")
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)

        # Update metrics and return their value.
        self.d_loss_tracker.update_state(d_tracked)
        self.g_loss_tracker.update_state(g_tracked)
        return {
            "d_loss": self.d_loss_tracker.result(),
            "g_loss": self.g_loss_tracker.result(),
        }


# Prepare the dataset: generated "images", and the latent vectors and label jitter the guide draws in its step
strategy = tf.distribute.MirroredStrategy()
batch_size = 16 * strategy.num_replicas_in_sync
rng = np.random.default_rng(11)
all_digits = rng.uniform(size=(batch_size * 4, FEATURES)).astype("float32")
latent = rng.normal(size=(2, batch_size * 4, latent_dim)).astype("float32")
jitter = rng.uniform(size=(batch_size * 4, 2)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices({"images": all_digits, "latent_d": latent[0], "latent_g": latent[1],
                                               "jitter": jitter}).batch(batch_size)

with strategy.scope():
    discriminator, generator = make_discriminator(), make_generator()
    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    reduction = "sum_over_batch_size" if case == "guide_losses" else "none"
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True, reduction=reduction),
    )
    if case != "optimizers_built_in_the_step":  # the guide leaves them to build in fit's first step
        gan.d_optimizer.build(discriminator.trainable_variables)
        gan.g_optimizer.build(generator.trainable_variables)

gan.fit(dataset, epochs=ARGS.epochs)
