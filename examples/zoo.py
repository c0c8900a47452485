"""A zoo of custom training loops in several styles, to measure the check's verdicts and causes
beyond the one style of examples/mistakes.py (a Sequential MLP, tuple inputs, SGD).

Each factory ``name(ctx) -> Workload`` (suite/engine/workload.py) is a loop a user might write:
a right one (it must PASS, some of them look wrong but are distribution-correct) or one with a
single mistake. ``EXPECTED`` (module end) names the cause the check must diagnose for each
(None: a right loop; "random_draws": a right loop the check cannot compare, status RANDOM),
``STYLE`` says how it is written, and ``HARMLESS_ON`` names the spec kinds under which the
mistake trains what one device trains.

    python -m suite.check examples.zoo:right_weighted_global_weight_sum --strategies mirrored:2

The styles vary:
  models     keras.Sequential, the functional API, a subclassed keras.Model (with its own step);
  inputs     ``(x, y)``, ``({"features": x}, y)``, ``{"x": x, "y": y}``, ``((x, weight), y)``;
  feeding    ``distribute="dataset"`` (global batches) and ``distribute="function"`` (the dataset
             fn shards by the input context and batches per replica);
  optimizers SGD and Adam (built in the factory, in the scope);
  tasks      an MLP classifier (8 inputs, 16 hidden, 3 classes) and a tiny regression with a
             4-dimensional label.
Data are deterministic numpy arrays made here: 144 examples (three global batches of 48), or 119
where a short last batch is the point. No Dropout or BatchNormalization (mistakes.py covers
them); Keras metrics only in the loops about a metric.
"""

import numpy as np
import tensorflow as tf

from suite.engine.workload import Workload

keras = tf.keras
EXAMPLES = 144  # three global batches of 48
SHORT = 119  # two of 48 and a short one of 23, split unevenly by 2 replicas
SUM = tf.distribute.ReduceOp.SUM


# -- data ----------------------------------------------------------------------------------------
def classification(n: int = EXAMPLES, seed: int = 1):
    """Features (n, 8), labels in 0..2, and example weights of 0.25, 1 or 2 (drawn unevenly, so two
    replicas' shares of a batch weigh differently)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(8, 3)), axis=1).astype(np.int64)
    w = rng.choice(np.array([0.25, 1.0, 2.0], np.float32), size=n, p=[0.4, 0.3, 0.3]).astype(np.float32)
    return x, y, w


def regression(n: int = EXAMPLES, seed: int = 2):
    """Features (n, 8) and a 4-dimensional label."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=(8, 4))) + 0.1 * rng.normal(size=(n, 4))).astype(np.float32)
    return x, y


def _pipeline(elements, ctx, distribute, mistake=None):
    """The dataset fn of the Workload protocol: global batches for experimental_distribute_dataset,
    or this input pipeline's shard batched per replica for distribute_datasets_from_function."""
    per_replica = ctx.per_replica_batch_size

    def dataset(global_batch_size, input_context):
        ds = tf.data.Dataset.from_tensor_slices(elements)
        if distribute == "function":
            if mistake != "input_not_sharded_per_worker":
                ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return ds.batch(input_context.get_per_replica_batch_size(global_batch_size))
        return ds.batch(per_replica if mistake == "per_replica_batch_size" else global_batch_size)

    return dataset


def _optimizer(kind, ctx, mistake=None, **kwargs):
    rate = 0.1 if kind == "sgd" else 0.01
    if mistake == "optimizer_scaled_by_replicas":
        rate *= ctx.num_replicas_in_sync  # the "linear scaling rule", on a loss that is already the global mean
    return keras.optimizers.SGD(rate, **kwargs) if kind == "sgd" else keras.optimizers.Adam(rate, **kwargs)


def _on_read(layer, name, value):
    """A non-trainable ON_READ variable with MEAN aggregation (Keras 3's keras.Variable; Keras 2's
    add_weight, which keras.Variable is not)."""
    if hasattr(keras, "Variable"):
        return keras.Variable(value, trainable=False, name=name, synchronization="on_read", aggregation="mean")
    return layer.add_weight(name=name, shape=value.shape, initializer=keras.initializers.Constant(value),
                            trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.MEAN)


class RunningScale(keras.layers.Layer):
    """Divides its inputs by a running mean of their absolute values kept in an ON_READ variable:
    under a strategy each replica updates its own copy from its own batch."""

    def build(self, shape):
        self.scale = _on_read(self, "scale", np.ones(shape[-1], np.float32))

    def call(self, x, training=False):
        if training:
            self.scale.assign(0.5 * self.scale + 0.5 * tf.reduce_mean(tf.abs(x), axis=0))
        return x / (self.scale + 0.1)


# Made at import: outside any strategy's scope. (An Adam made here cannot even be built in a
# strategy's scope: its build raises "Mixing different tf.distribute.Strategy objects", so the
# loop cannot run at all; a plain SGD has no slots to build and trains with variables outside.)
IMPORTED_SGD = keras.optimizers.SGD(0.1)


# == style 1: the functional API ================================================================
def _functional(ctx, mistake=None, inputs="dict", opt="sgd", distribute="dataset", n=EXAMPLES, l2=0.0,
                metric=False, clipnorm=None, running=False, scaling="compute_average"):
    """A functional MLP classifier. ``inputs``: "dict" ({"features": x}, y), "tuple" (x, y) or
    "weighted" ((x, w), y). ``scaling``: how a right loop scales the per-example losses."""
    features = keras.Input((8,), name="features")
    h = RunningScale()(features) if running else features
    reg = keras.regularizers.L2(l2) if l2 else None
    h = keras.layers.Dense(16, activation="relu", kernel_regularizer=reg)(h)
    logits = keras.layers.Dense(3)(h)
    model = keras.Model({"features": features} if inputs == "dict" else features, logits)
    if mistake == "created_outside_scope":
        optimizer = IMPORTED_SGD
    else:
        optimizer = _optimizer(opt, ctx, mistake, **({"global_clipnorm": clipnorm} if clipnorm else {}))
    optimizer.build(model.trainable_variables)
    reduction = "sum_over_batch_size" if mistake == "keras_loss_reduction" else "none"
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    mean_loss = keras.metrics.Mean(name="loss")
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    x, y, w = classification(n)
    elements = {"dict": ({"features": x}, y), "tuple": (x, y), "weighted": ((x, w), y)}[inputs]
    gb = ctx.global_batch_size

    def step(batch):
        if inputs == "weighted":
            (features, weights), labels = batch
        else:
            (features, labels), weights = batch, None
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            if mistake == "loss_averaged_per_replica":
                loss = tf.reduce_mean(per_example)
            elif mistake == "keras_loss_reduction":
                loss = loss_object(labels, logits, sample_weight=weights)
            elif mistake == "short_batch_weighted_differently":
                loss = tf.nn.compute_average_loss(per_example, sample_weight=weights)  # replicas x local batch
            elif mistake == "weighted_loss_normalized_per_replica":
                loss = tf.reduce_sum(weights * per_example) / tf.reduce_sum(weights)
            elif scaling == "sum_over_global":  # looks unscaled, but the global batch is the divisor
                loss = tf.reduce_sum(per_example if weights is None else weights * per_example) / gb
            elif scaling == "global_weight":  # the weighted mean over the GLOBAL batch: all replicas' weights
                total = tf.distribute.get_replica_context().all_reduce(SUM, tf.reduce_sum(weights))
                loss = tf.reduce_sum(weights * per_example) / tf.stop_gradient(total)
            else:
                loss = tf.nn.compute_average_loss(per_example, sample_weight=weights, global_batch_size=gb)
            if l2:
                penalty = tf.add_n(model.losses)
                loss += penalty if mistake == "regularization_not_scaled" else tf.nn.scale_regularization_loss(penalty)
        grads = tape.gradient(loss, model.trainable_variables)
        if mistake == "clipped_before_aggregation":
            grads, _ = tf.clip_by_global_norm(grads, 0.01)
        if mistake == "gradients_aggregated_by_hand":
            grads = tf.distribute.get_replica_context().all_reduce(SUM, grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if metric:
            mean_loss.update_state(loss if mistake == "metric_fed_scaled_loss" else per_example)
            accuracy.update_state(labels, logits)
        return loss

    return Workload(model, optimizer, loss_object, _pipeline(elements, ctx, distribute, mistake), step=step,
                    metrics={"loss": mean_loss, "accuracy": accuracy} if metric else {},
                    loss_reduction="MEAN" if mistake == "reduce_mean_for_sum" else "SUM", distribute=distribute)


# == style 2: a subclassed keras.Model with its own train step ==================================
class Regressor(keras.Model):
    """A tiny regression MLP (8 -> 16 -> 4) that carries its own distributed train step."""

    def __init__(self, optimizer, ctx, mistake=None, l2=0.0, running=False, weighted=False):
        super().__init__()
        self.running = running
        if running:  # a running center of the inputs in an ON_READ variable, updated per replica
            self.center = _on_read(self, "center", np.zeros(8, np.float32))
        self.hidden = keras.layers.Dense(16, activation="tanh",
                                         kernel_regularizer=keras.regularizers.L2(l2) if l2 else None)
        self.head = keras.layers.Dense(4)
        self.step_optimizer, self.ctx, self.mistake, self.l2, self.weighted = optimizer, ctx, mistake, l2, weighted

    def call(self, x, training=False):
        if self.running:
            if training:
                self.center.assign(0.5 * self.center + 0.5 * tf.reduce_mean(x, axis=0))
            x = x - self.center
        return self.head(self.hidden(x))

    def distributed_train_step(self, batch):
        """One replica's step on a {"x", "y"[, "w"]} batch; returns its scaled loss."""
        mistake, gb = self.mistake, self.ctx.global_batch_size
        x, y, w = batch["x"], batch["y"], batch.get("w")
        with tf.GradientTape() as tape:
            out = self(x, training=True)
            per_example = tf.reduce_mean(tf.square(y - out), axis=-1)  # one value per example first
            if mistake == "loss_averaged_per_replica":
                loss = tf.reduce_mean(tf.square(y - out))  # over the replica's examples and label dimensions
            elif mistake == "loss_divided_twice":
                loss = tf.nn.compute_average_loss(per_example, sample_weight=w, global_batch_size=gb)
                loss /= self.ctx.num_replicas_in_sync
            elif mistake == "short_batch_weighted_differently":
                loss = tf.nn.compute_average_loss(per_example)
            elif mistake == "weighted_loss_normalized_per_replica":
                loss = tf.reduce_sum(w * per_example) / tf.reduce_sum(w)
            elif mistake == "looks_unscaled":  # right: summed here, divided by the GLOBAL batch
                loss = tf.reduce_sum(per_example) / gb
            else:
                loss = tf.nn.compute_average_loss(per_example, sample_weight=w, global_batch_size=gb)
            if self.l2:
                penalty = tf.add_n(self.losses)
                loss += penalty if mistake == "regularization_not_scaled" else tf.nn.scale_regularization_loss(penalty)
        grads = tape.gradient(loss, self.trainable_variables)
        if mistake == "gradients_aggregated_by_hand":
            grads = [tf.distribute.get_replica_context().all_reduce(SUM, g) for g in grads]
        self.step_optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return loss


def _subclassed(ctx, mistake=None, opt="adam", distribute="function", n=EXAMPLES, l2=0.0, running=False,
                weighted=False, loss_reduction=None):
    optimizer = _optimizer(opt, ctx, mistake)
    model = Regressor(optimizer, ctx, mistake, l2=l2, running=running, weighted=weighted)
    model(np.zeros((1, 8), np.float32))  # built here: the check loads the reference's initial values
    optimizer.build(model.trainable_variables)
    x, y = regression(n)
    elements = {"x": x, "y": y}
    if weighted:
        elements["w"] = classification(n)[2]
    loss_fn = lambda y_true, y_pred: tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)  # noqa: E731
    return Workload(model, optimizer, loss_fn, _pipeline(elements, ctx, distribute, mistake),
                    step=model.distributed_train_step, loss_reduction=loss_reduction or "SUM", distribute=distribute)


# == style 3: keras.Sequential regression, a Keras loss object =================================
def _sequential(ctx, mistake=None, opt="adam", distribute="function", n=EXAMPLES, clipnorm=None):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])
    optimizer = _optimizer(opt, ctx, mistake, **({"global_clipnorm": clipnorm} if clipnorm else {}))
    optimizer.build(model.trainable_variables)
    reduction = "sum_over_batch_size" if mistake == "keras_loss_reduction" else "none"
    mse = keras.losses.MeanSquaredError(reduction=reduction)  # "none": one value per example (mean over dims)
    x, y = regression(n)

    def step(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            if mistake == "keras_loss_reduction":
                loss = mse(y, pred)
            else:
                loss = tf.nn.compute_average_loss(mse(y, pred), global_batch_size=ctx.global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return Workload(model, optimizer, mse, _pipeline((x, y), ctx, distribute, mistake), step=step,
                    distribute=distribute)


# == style 4: a subclassed keras.Model called by a plain step function =========================
class TwoLayer(keras.Model):
    """A subclassed binary classifier (8 -> 10 tanh with an L2 penalty -> 2 logits), as keras.io's
    custom-loop examples subclass keras.Model; the loop's step is a plain function beside it."""

    def __init__(self, l2=0.01):
        super().__init__()
        self.hidden = keras.layers.Dense(10, activation="tanh", kernel_regularizer=keras.regularizers.L2(l2))
        self.out = keras.layers.Dense(2)

    def call(self, x, training=False):
        return self.out(self.hidden(x))


def _two_layer(ctx, mistake=None, opt="sgd"):
    model = TwoLayer()
    model(np.zeros((1, 8), np.float32))  # built here: the check loads the reference's initial values
    optimizer = _optimizer(opt, ctx, mistake)
    optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    x, y, _ = classification()
    y = (y > 0).astype(np.int64)  # two classes

    def step(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(features, training=True))
            penalty = tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            if mistake == "loss_averaged_per_replica":
                scaled = tf.reduce_mean(per_example) + penalty
            else:
                scaled = tf.nn.compute_average_loss(per_example, global_batch_size=ctx.global_batch_size) + penalty
            # the mistake gradient_of_per_replica_mean: the tape on the replica's own mean, the returned loss right
            taped = tf.reduce_mean(per_example) + penalty if mistake == "gradient_of_per_replica_mean" else scaled
        grads = tape.gradient(taped, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return scaled

    return Workload(model, optimizer, loss_object, _pipeline((x, y), ctx, "dataset", mistake), step=step)


# == style 5: a Sequential classifier with input noise of the loop's own ===========================
def _noisy(ctx):
    """Gaussian input noise drawn in the step from a tf.random.Generator made in the scope (the
    guide's advice for per-replica streams): right, but one device and the replicas cannot draw the
    same numbers, so the check can only say that it cannot compare them."""
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    optimizer = _optimizer("sgd", ctx)
    optimizer.build(model.trainable_variables)
    noise = tf.random.Generator.from_seed(3)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    x, y, _ = classification()

    def step(batch):
        features, labels = batch
        features = features + 0.1 * noise.normal(tf.shape(features))
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(labels, model(features, training=True)),
                                              global_batch_size=ctx.global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return Workload(model, optimizer, loss_object, _pipeline((x, y), ctx, "dataset"), step=step)


# == style 6: several models and optimizers (a GAN; a student distilled from a frozen teacher) ====
def gan_data(n: int = EXAMPLES, seed: int = 4):
    """Real samples (n, 4) on a curve, and the generator's input noise (n, 2), drawn here (the step
    draws nothing: random draws of the step's own could not be compared)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(-1, 1, size=(n, 1))
    real = np.concatenate([t, t ** 2, np.sin(2 * t), 0.5 * t], axis=1).astype(np.float32)
    return real, rng.normal(size=(n, 2)).astype(np.float32)


def _gan(ctx, mistake=None):
    """A GAN as the custom-training guide motivates custom loops: two discriminator steps per generator
    step on each batch, each model with its own optimizer; the step returns each model's loss (the
    discriminator's of its first step, at the weights both runs share)."""
    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(4)],
                                 name="generator")
    discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                                      keras.layers.Dense(1)], name="discriminator")
    g_opt = keras.optimizers.Adam(0.01)
    d_opt = keras.optimizers.Adam(0.01) if mistake == "gradients_aggregated_by_hand" else keras.optimizers.SGD(0.1)
    g_opt.build(generator.trainable_variables)
    d_opt.build(discriminator.trainable_variables)
    bce = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    real, noise = gan_data()
    gb = ctx.global_batch_size

    def scaled(per_example, model_name):
        if mistake == f"{model_name}_loss_averaged_per_replica":
            return tf.reduce_mean(per_example)
        return tf.nn.compute_average_loss(per_example, global_batch_size=gb)

    def step(batch):
        x, z = batch
        d_losses = []
        for _ in range(2):  # two discriminator steps
            with tf.GradientTape() as tape:
                fake = generator(z, training=True)
                real_logits, fake_logits = discriminator(x, training=True), discriminator(fake, training=True)
                per_example = (bce(tf.ones_like(real_logits), real_logits)
                               + bce(tf.zeros_like(fake_logits), fake_logits))
                d_loss = scaled(per_example, "discriminator")
            grads = tape.gradient(d_loss, discriminator.trainable_variables)
            if mistake == "gradients_aggregated_by_hand":  # summed here, and again by apply_gradients
                grads = tf.distribute.get_replica_context().all_reduce(SUM, grads)
            d_opt.apply_gradients(zip(grads, discriminator.trainable_variables))
            d_losses.append(d_loss)
        with tf.GradientTape() as tape:
            fake_logits = discriminator(generator(z, training=True), training=True)
            g_loss = scaled(bce(tf.ones_like(fake_logits), fake_logits), "generator")
        grads = tape.gradient(g_loss, generator.trainable_variables)
        g_opt.apply_gradients(zip(grads, generator.trainable_variables))
        return {"generator": g_loss, "discriminator": d_losses[0]}

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((real, noise)).batch(global_batch_size)

    return Workload(None, None, bce, dataset, step=step, models={"generator": generator, "discriminator": discriminator},
                    optimizers={"generator": g_opt, "discriminator": d_opt})


def _distillation(ctx, mistake=None):
    """keras.io's knowledge distillation as a custom loop: a frozen teacher (its own model, never
    trained) and a student trained on the labels and the teacher's softened outputs."""
    teacher = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)],
                               name="teacher")
    teacher.trainable = False
    student = keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, activation="relu"), keras.layers.Dense(3)],
                               name="student")
    optimizer = _optimizer("adam", ctx)
    optimizer.build(student.trainable_variables)
    x, y, _ = classification()
    hard = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    soft = keras.losses.KLDivergence(reduction="none")
    temperature, alpha = 3.0, 0.3

    def step(batch):
        features, labels = batch
        teacher_probs = tf.nn.softmax(teacher(features, training=False) / temperature)
        with tf.GradientTape() as tape:
            logits = student(features, training=True)
            per_example = (alpha * hard(labels, logits)
                           + (1 - alpha) * temperature ** 2 * soft(teacher_probs, tf.nn.softmax(logits / temperature)))
            if mistake == "loss_averaged_per_replica":
                loss = tf.reduce_mean(per_example)
            else:
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=ctx.global_batch_size)
        grads = tape.gradient(loss, student.trainable_variables)
        optimizer.apply_gradients(zip(grads, student.trainable_variables))
        return {"student": loss}

    return Workload(None, None, hard, _pipeline((x, y), ctx, "dataset", mistake), step=step,
                    models={"student": student, "teacher": teacher}, optimizers={"student": optimizer})


# == right loops: must PASS =======================================================================
def right_functional_dict_adam(ctx):
    return _functional(ctx, inputs="dict", opt="adam")


def right_sum_over_global_batch(ctx):
    """Looks unscaled: tf.reduce_sum(per_example) / ctx.global_batch_size, by hand."""
    return _functional(ctx, inputs="tuple", opt="sgd", scaling="sum_over_global")


def right_subclassed_sum_over_global_batch(ctx):
    """The subclassed model's own step sums its replica's losses and divides by the global batch."""
    return _subclassed(ctx, "looks_unscaled", opt="adam", distribute="function")


def right_weighted_compute_average(ctx):
    """compute_average_loss with sample_weight= and global_batch_size=."""
    return _functional(ctx, inputs="weighted", opt="sgd", distribute="function")


def right_weighted_subclassed(ctx):
    return _subclassed(ctx, opt="sgd", distribute="dataset", weighted=True)


def right_weighted_global_weight_sum(ctx):
    """Looks per-replica (divides by a sum of weights), but the sum is all-reduced: the global one."""
    return _functional(ctx, inputs="weighted", opt="adam", scaling="global_weight")


def right_sequential_regression(ctx):
    """A 4-dimensional label: the loss object (reduction "none") averages the dimensions per
    example first, then compute_average_loss divides by the global batch."""
    return _sequential(ctx, opt="adam", distribute="function")


def right_subclassed_regularized(ctx):
    return _subclassed(ctx, opt="sgd", distribute="dataset", l2=0.01)


def right_functional_regularized_function(ctx):
    """tf.nn.scale_regularization_loss of model.losses, fed from a function."""
    return _functional(ctx, inputs="dict", opt="sgd", distribute="function", l2=0.01)


def right_clipnorm_in_optimizer(ctx):
    """Clipping as the catalogue's fix for clipped_before_aggregation says: global_clipnorm on the
    optimizer. Measured on Keras 3.15: it FAILS under every spec with updates ~1.86x one device's,
    because Keras 3's BaseOptimizer.apply clips each replica's gradients (_clip_gradients) before
    the TensorFlow backend's _backend_update_step all-reduces them: Keras clips before
    aggregation too (not a known deviation yet; the check names no cause)."""
    return _sequential(ctx, opt="sgd", distribute="dataset", clipnorm=0.05)


def right_metrics(ctx):
    """A Mean of the per-example losses and an accuracy (CentralStorage, Keras 3: known deviation
    keras3-central-storage-metric-accumulation)."""
    return _functional(ctx, inputs="tuple", opt="sgd", metric=True)


def right_subclassed_model_plain_step(ctx):
    """A subclassed keras.Model (its layers Keras' own) trained by a plain step function with
    compute_average_loss and the scaled L2 penalty: right; its classes are the user's, so a control
    on it cannot tell them from Keras' (the stand-in control can speak for the optimizer)."""
    return _two_layer(ctx)


def right_input_noise_from_a_generator(ctx):
    """Input noise from a tf.random.Generator made in the scope: the check says it cannot compare."""
    return _noisy(ctx)


def right_gan_two_discriminator_steps(ctx):
    """A GAN with two optimizers, two discriminator steps per generator step."""
    return _gan(ctx)


def right_distillation_frozen_teacher(ctx):
    """A student distilled from a frozen teacher: two models, one optimizer."""
    return _distillation(ctx)


# == one catalogued mistake =======================================================================
def loss_averaged_per_replica_functional(ctx):
    return _functional(ctx, "loss_averaged_per_replica", inputs="dict", opt="adam")


def loss_averaged_per_replica_subclassed(ctx):
    """tf.reduce_mean over the replica's (batch, 4) squared errors."""
    return _subclassed(ctx, "loss_averaged_per_replica", opt="sgd", distribute="function")


def loss_divided_twice_subclassed(ctx):
    return _subclassed(ctx, "loss_divided_twice", opt="sgd", distribute="dataset", weighted=True)


def regularization_not_scaled_functional(ctx):
    return _functional(ctx, "regularization_not_scaled", inputs="dict", opt="sgd", l2=0.01)


def regularization_not_scaled_subclassed(ctx):
    return _subclassed(ctx, "regularization_not_scaled", opt="sgd", distribute="function", l2=0.01)


def metric_fed_scaled_loss_functional(ctx):
    return _functional(ctx, "metric_fed_scaled_loss", inputs="dict", opt="sgd", metric=True)


def keras_loss_reduction_functional(ctx):
    """A weighted SparseCategoricalCrossentropy with its default reduction, on a short last batch."""
    return _functional(ctx, "keras_loss_reduction", inputs="weighted", opt="sgd", n=SHORT)


def keras_loss_reduction_sequential(ctx):
    """MeanSquaredError with its default reduction, on a short last batch."""
    return _sequential(ctx, "keras_loss_reduction", opt="sgd", distribute="dataset", n=SHORT)


def created_outside_scope_functional(ctx):
    """An SGD made at import (the functional model and dict-free tuple inputs are the style)."""
    return _functional(ctx, "created_outside_scope", inputs="tuple")


def clipped_before_aggregation_functional(ctx):
    return _functional(ctx, "clipped_before_aggregation", inputs="dict", opt="sgd", distribute="function")


def per_replica_batch_size_functional(ctx):
    return _functional(ctx, "per_replica_batch_size", inputs="weighted", opt="adam")


def short_batch_weighted_differently_functional(ctx):
    """compute_average_loss(sample_weight=...) without global_batch_size, on a short last batch."""
    return _functional(ctx, "short_batch_weighted_differently", inputs="weighted", opt="sgd", n=SHORT)


def reduce_mean_for_sum_subclassed(ctx):
    return _subclassed(ctx, opt="adam", distribute="function", loss_reduction="MEAN")


def replicas_disagree_functional(ctx):
    return _functional(ctx, "replicas_disagree", inputs="dict", opt="sgd", running=True)


def replicas_disagree_subclassed(ctx):
    return _subclassed(ctx, "replicas_disagree", opt="adam", distribute="function", running=True)


# == the four new causes ==========================================================================
def gradients_aggregated_by_hand_functional(ctx):
    return _functional(ctx, "gradients_aggregated_by_hand", inputs="tuple", opt="sgd")


def gradients_aggregated_by_hand_subclassed(ctx):
    """With Adam the doubled gradients barely move the weights (Adam is scale-invariant up to its
    epsilon); its moments show it."""
    return _subclassed(ctx, "gradients_aggregated_by_hand", opt="adam", distribute="function")


def optimizer_scaled_by_replicas_sequential(ctx):
    return _sequential(ctx, "optimizer_scaled_by_replicas", opt="adam", distribute="function")


def optimizer_scaled_by_replicas_functional(ctx):
    return _functional(ctx, "optimizer_scaled_by_replicas", inputs="weighted", opt="sgd")


def input_not_sharded_per_worker_functional(ctx):
    return _functional(ctx, "input_not_sharded_per_worker", inputs="dict", opt="sgd", distribute="function")


def input_not_sharded_per_worker_subclassed(ctx):
    return _subclassed(ctx, "input_not_sharded_per_worker", opt="adam", distribute="function")


def weighted_loss_normalized_per_replica_functional(ctx):
    return _functional(ctx, "weighted_loss_normalized_per_replica", inputs="weighted", opt="sgd")


def weighted_loss_normalized_per_replica_subclassed(ctx):
    return _subclassed(ctx, "weighted_loss_normalized_per_replica", opt="adam", distribute="function", weighted=True)


def loss_averaged_per_replica_subclassed_plain_step(ctx):
    return _two_layer(ctx, "loss_averaged_per_replica")


def gradient_of_per_replica_mean_subclassed(ctx):
    """The returned loss is compute_average_loss's, but the tape differentiates the replica's own
    tf.reduce_mean."""
    return _two_layer(ctx, "gradient_of_per_replica_mean")


def gan_generator_loss_averaged_per_replica(ctx):
    return _gan(ctx, "generator_loss_averaged_per_replica")


def gan_discriminator_loss_averaged_per_replica(ctx):
    return _gan(ctx, "discriminator_loss_averaged_per_replica")


def gan_discriminator_gradients_aggregated_by_hand(ctx):
    """The discriminator's gradients all-reduced before its Adam's apply_gradients sums them again:
    Adam's steps hardly change with the scale of its gradients, so what differs first may be its
    moments alone, the second optimizer's state."""
    return _gan(ctx, "gradients_aggregated_by_hand")


def distillation_loss_averaged_per_replica(ctx):
    return _distillation(ctx, "loss_averaged_per_replica")


# == batches the suite's canonical step cannot train: (x, y, sample_weight), as Keras' fit takes them ==
def _weighted_triple(ctx, mistake=None):
    """A functional classifier whose batches are ``(x, y, sample_weight)`` triples; the step weights
    each example's loss. The canonical-step control cannot train such batches (it takes ``(x, y)``), so
    where this loop diverges only the stand-in control can say whose the divergence is."""
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Dense(16, activation="tanh")(inputs)))
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    x, y, w = classification()
    gb = ctx.global_batch_size

    def step(batch):
        features, labels, weights = batch
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(features, training=True))
            if mistake == "loss_averaged_per_replica":
                loss = tf.reduce_sum(weights * per_example) / tf.cast(tf.shape(per_example)[0], tf.float32)
            else:
                loss = tf.nn.compute_average_loss(per_example, sample_weight=weights, global_batch_size=gb)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return Workload(model, optimizer, loss_object, _pipeline((x, y, w), ctx, "dataset"), step=step)


def right_weighted_triple(ctx):
    """compute_average_loss with sample_weight= and global_batch_size= on (x, y, sample_weight) batches."""
    return _weighted_triple(ctx)


def loss_averaged_per_replica_weighted_triple(ctx):
    """The same loop dividing each replica's weighted sum by its own batch's examples."""
    return _weighted_triple(ctx, "loss_averaged_per_replica")


# == the tables ===================================================================================
EXPECTED: dict[str, str | None] = {
    "right_functional_dict_adam": None,
    "right_sum_over_global_batch": None,
    "right_subclassed_sum_over_global_batch": None,
    "right_weighted_compute_average": None,
    "right_weighted_subclassed": None,
    "right_weighted_global_weight_sum": None,
    "right_weighted_triple": None,
    "right_sequential_regression": None,
    "right_subclassed_regularized": None,
    "right_functional_regularized_function": None,
    "right_clipnorm_in_optimizer": None,
    "right_metrics": None,
    "right_subclassed_model_plain_step": None,
    "right_input_noise_from_a_generator": "random_draws",
    "right_gan_two_discriminator_steps": None,
    "right_distillation_frozen_teacher": None,
    "gan_generator_loss_averaged_per_replica": "generator: loss_averaged_per_replica",
    "gan_discriminator_loss_averaged_per_replica": "discriminator: loss_averaged_per_replica",
    "gan_discriminator_gradients_aggregated_by_hand": "discriminator: gradients_aggregated_by_hand",
    "distillation_loss_averaged_per_replica": "student: loss_averaged_per_replica",
    "loss_averaged_per_replica_subclassed_plain_step": "loss_averaged_per_replica",
    "gradient_of_per_replica_mean_subclassed": "gradient_of_per_replica_mean",
    "loss_averaged_per_replica_functional": "loss_averaged_per_replica",
    "loss_averaged_per_replica_subclassed": "loss_averaged_per_replica",
    "loss_divided_twice_subclassed": "loss_divided_twice",
    "regularization_not_scaled_functional": "regularization_not_scaled",
    "regularization_not_scaled_subclassed": "regularization_not_scaled",
    "metric_fed_scaled_loss_functional": "metric_fed_scaled_loss",
    "keras_loss_reduction_functional": "keras_loss_reduction",
    "keras_loss_reduction_sequential": "keras_loss_reduction",
    "created_outside_scope_functional": "created_outside_scope",
    "clipped_before_aggregation_functional": "clipped_before_aggregation",
    "per_replica_batch_size_functional": "per_replica_batch_size",
    "short_batch_weighted_differently_functional": "short_batch_weighted_differently",
    "reduce_mean_for_sum_subclassed": "reduce_mean_for_sum",
    "replicas_disagree_functional": "replicas_disagree",
    "replicas_disagree_subclassed": "replicas_disagree",
    "gradients_aggregated_by_hand_functional": "gradients_aggregated_by_hand",
    "gradients_aggregated_by_hand_subclassed": "gradients_aggregated_by_hand",
    "optimizer_scaled_by_replicas_sequential": "optimizer_scaled_by_replicas",
    "optimizer_scaled_by_replicas_functional": "optimizer_scaled_by_replicas",
    "input_not_sharded_per_worker_functional": "input_not_sharded_per_worker",
    "input_not_sharded_per_worker_subclassed": "input_not_sharded_per_worker",
    "weighted_loss_normalized_per_replica_functional": "weighted_loss_normalized_per_replica",
    "weighted_loss_normalized_per_replica_subclassed": "weighted_loss_normalized_per_replica",
    "loss_averaged_per_replica_weighted_triple": "loss_averaged_per_replica",
}

STYLE: dict[str, str] = {
    "right_functional_dict_adam": "functional, dict inputs, Adam, dataset",
    "right_sum_over_global_batch": "functional, tuple inputs, SGD, dataset; reduce_sum / global batch",
    "right_subclassed_sum_over_global_batch": "subclassed regression, {x,y} dict, Adam, function; reduce_sum / global batch",
    "right_weighted_compute_average":
        "functional, weighted ((x, w), y), SGD, function; compute_average_loss(sample_weight, global_batch_size)",
    "right_weighted_subclassed":
        "subclassed regression, {x,y,w} dict, SGD, dataset; compute_average_loss(sample_weight, global_batch_size)",
    "right_weighted_global_weight_sum":
        "functional, weighted ((x, w), y), Adam, dataset; divided by the all-reduced sum of weights",
    "right_weighted_triple":
        "functional, (x, y, sample_weight) triples, SGD, dataset; compute_average_loss(sample_weight, global_batch_size)",
    "right_sequential_regression": "Sequential regression (4-dim label), tuple, Adam, function; MSE reduction none",
    "right_subclassed_regularized": "subclassed regression, {x,y} dict, SGD, dataset; L2 + scale_regularization_loss",
    "right_functional_regularized_function": "functional, dict inputs, SGD, function; L2 + scale_regularization_loss",
    "right_clipnorm_in_optimizer": "Sequential regression, tuple, SGD(global_clipnorm), dataset",
    "right_metrics": "functional, tuple inputs, SGD, dataset; Mean + accuracy metrics",
    "right_subclassed_model_plain_step": "subclassed binary classifier, tuple, SGD, dataset; step function beside it",
    "right_input_noise_from_a_generator": "Sequential classifier, tuple, SGD, dataset; tf.random.Generator input noise",
    "right_gan_two_discriminator_steps": "GAN: two Sequential models, Adam + SGD, 2 discriminator steps per generator step",
    "right_distillation_frozen_teacher": "distillation: a student and a frozen teacher, one Adam, KL + hard labels",
    "gan_generator_loss_averaged_per_replica": "GAN, the generator's loss a per-replica mean",
    "gan_discriminator_loss_averaged_per_replica": "GAN, the discriminator's loss a per-replica mean",
    "gan_discriminator_gradients_aggregated_by_hand": "GAN, two Adams, the discriminator's gradients all-reduced by hand",
    "distillation_loss_averaged_per_replica": "distillation, the student's loss a per-replica mean",
    "loss_averaged_per_replica_subclassed_plain_step": "subclassed binary classifier, tuple, SGD, dataset",
    "gradient_of_per_replica_mean_subclassed": "subclassed binary classifier, tuple, SGD, dataset; reported loss right",
    "loss_averaged_per_replica_functional": "functional, dict inputs, Adam, dataset",
    "loss_averaged_per_replica_subclassed": "subclassed regression, {x,y} dict, SGD, function",
    "loss_divided_twice_subclassed": "subclassed regression, {x,y,w} dict (weighted), SGD, dataset",
    "regularization_not_scaled_functional": "functional, dict inputs, SGD, dataset",
    "regularization_not_scaled_subclassed": "subclassed regression, {x,y} dict, SGD, function",
    "metric_fed_scaled_loss_functional": "functional, dict inputs, SGD, dataset; Mean + accuracy metrics",
    "keras_loss_reduction_functional": "functional, weighted ((x, w), y), SGD, dataset; 119 examples",
    "keras_loss_reduction_sequential": "Sequential regression, tuple, SGD, dataset; MSE object; 119 examples",
    "created_outside_scope_functional": "functional, tuple inputs, SGD made at import, dataset",
    "clipped_before_aggregation_functional": "functional, dict inputs, SGD, function",
    "per_replica_batch_size_functional": "functional, weighted ((x, w), y), Adam, dataset",
    "short_batch_weighted_differently_functional": "functional, weighted ((x, w), y), SGD, dataset; 119 examples",
    "reduce_mean_for_sum_subclassed": "subclassed regression, {x,y} dict, Adam, function",
    "replicas_disagree_functional": "functional, dict inputs, SGD, dataset; ON_READ running scale layer",
    "replicas_disagree_subclassed": "subclassed regression, {x,y} dict, Adam, function; ON_READ running center",
    "gradients_aggregated_by_hand_functional": "functional, tuple inputs, SGD, dataset",
    "gradients_aggregated_by_hand_subclassed": "subclassed regression, {x,y} dict, Adam, function",
    "optimizer_scaled_by_replicas_sequential": "Sequential regression, tuple, Adam, function",
    "optimizer_scaled_by_replicas_functional": "functional, weighted ((x, w), y), SGD, dataset",
    "input_not_sharded_per_worker_functional": "functional, dict inputs, SGD, function",
    "input_not_sharded_per_worker_subclassed": "subclassed regression, {x,y} dict, Adam, function",
    "weighted_loss_normalized_per_replica_functional": "functional, weighted ((x, w), y), SGD, dataset",
    "weighted_loss_normalized_per_replica_subclassed": "subclassed regression, {x,y,w} dict, Adam, function",
    "loss_averaged_per_replica_weighted_triple": "functional, (x, y, sample_weight) triples, SGD, dataset",
}

HARMLESS_ON: dict[str, tuple[str, ...]] = {
    # one worker is one input pipeline: distribute_datasets_from_function calls the dataset fn once
    # and hands its per-replica batches to the replicas in turn, so not sharding changes nothing;
    # only two or more workers read the same examples twice.
    "input_not_sharded_per_worker_functional": ("mirrored", "central_storage"),
    "input_not_sharded_per_worker_subclassed": ("mirrored", "central_storage"),
    # CentralStorage keeps one copy of every variable (ON_READ ones too) on the parameter device:
    # there are no replica copies to disagree.
    "replicas_disagree_functional": ("central_storage",),
    "replicas_disagree_subclassed": ("central_storage",),
}

