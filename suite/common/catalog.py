"""The catalogues both sides name things by (no TensorFlow, no reference): the suite's optimizer
configurations, the Keras loss and metric classes behind the suite's short names, and the
mutants. The pytest side draws cases and writes repro snippets with these names; engines build
the Keras objects from them; reference/ implements the optimizer rules of ``OPTIMIZERS``."""

# name -> (keras.optimizers class, constructor arguments). Binary fractions, so the float32
# learning-rate variable and the float32-rounded constants Keras uses are exact.
OPTIMIZERS: dict[str, tuple[str, dict]] = {
    "sgd": ("SGD", {"learning_rate": 0.125}),
    "sgd_momentum": ("SGD", {"learning_rate": 0.0625, "momentum": 0.875}),
    "sgd_nesterov": ("SGD", {"learning_rate": 0.0625, "momentum": 0.875, "nesterov": True}),
    "adam": ("Adam", {"learning_rate": 0.0625, "beta_1": 0.875, "beta_2": 0.9921875, "epsilon": 1e-7}),
    "rmsprop": ("RMSprop", {"learning_rate": 0.0625, "rho": 0.875, "epsilon": 1e-7}),
    "adagrad": ("Adagrad", {"learning_rate": 0.125, "initial_accumulator_value": 0.125,
                            "epsilon": 1e-7}),
}

# optimizers whose update divides by a running magnitude of the gradient
ADAPTIVE = frozenset({"adam", "rmsprop", "adagrad"})


LOSS_CLASSES = {
    "mse": ("MeanSquaredError", {}),
    "mae": ("MeanAbsoluteError", {}),
    "sparse_cce_logits": ("SparseCategoricalCrossentropy", {"from_logits": True}),
    "sparse_cce_probs": ("SparseCategoricalCrossentropy", {"from_logits": False}),
    "cce_logits": ("CategoricalCrossentropy", {"from_logits": True}),
    "cce_probs": ("CategoricalCrossentropy", {"from_logits": False}),
    "bce_logits": ("BinaryCrossentropy", {"from_logits": True}),
}

METRIC_CLASSES = {
    "mean": "Mean", "sum": "Sum", "accuracy": "Accuracy", "binary_accuracy": "BinaryAccuracy",
    "sparse_categorical_accuracy": "SparseCategoricalAccuracy",
    "categorical_accuracy": "CategoricalAccuracy",
}

# TensorFlow's errors for a step XLA cannot compile under a strategy: collectives on CPU devices
# (the whole step of several workers), and a variable on another device than the compiled
# computation (https://www.tensorflow.org/xla/known_issues#tfvariable_on_a_different_device: the
# whole step of several devices; CentralStorage's variables, on one device for every replica),
# and (Keras 2.15's whole step) shapes XLA cannot prove equal at compile time: the replicas' slices
# of the global batch have sizes that are data, as a short last batch's are
XLA_UNSUPPORTED = (r"Collectives are not yet implemented for CPU devices when compiling with XLA"
                   r"|xla/known_issues#tfvariable_on_a_different_device"
                   r"|Fail to proof the equality of two dimensions at compile time")

# The Keras building blocks the benchmarks switch on in a train step (suite/harness/tools/bench.py,
# suite/engine/probes/bench.py): name -> what is switched on.
BENCH_BLOCKS = {
    "clipping": "global_clipnorm=1.0 on the optimizer (clipping the summed gradient in apply_gradients)",
    "mixed_precision": "the mixed_float16 policy with a dynamic LossScaleOptimizer; the loss scaled and the "
                       "gradients unscaled in the step, as the mixed-precision guide's custom loop does",
    "sync_batch_norm": "BatchNormalization(synchronized=True) after each hidden layer (MLP) or convolution (CNN)",
    "xla": "the replica's forward and backward pass in tf.function(jit_compile=True); apply_gradients outside it",
}

# Deliberately wrong engines for tests/mutation/test_mutants.py (suite/engine/mutants/): engines import
# that package only when the pool wants a mutant (TFDS_ENGINE_IMPORTS), which switches one on per call
# (its probe ``mutants.switch``), or ``TFDS_MUTANT=<name>`` in an engine's environment at start.
MUTANTS = {
    "local_batch_denominator": "compute_average_loss replaced by a per-replica mean",
    "unnormalised_multi_dim": "multi-dimensional per-element losses never normalised",
    "scale_reg_not_divided": "scale_regularization_loss returns the sum, not sum / replicas",
    "double_gradient_aggregation": "gradients all-reduced by hand, then summed again by apply_gradients",
    "metric_first_replica": "cross-replica metric result read from the first replica's copies only",
    "reduce_mean_of_means": "MEAN over axis 0 as the mean of per-replica means",
    "reversed_local_results": "each replica reports the replica id of its mirror image (R-1-id)",
    "keras_loss_times_replicas": "Keras loss values multiplied by the replica count",
    "input_rows_to_first_replica": "the dataset batched with half the global batch (a per-replica size)",
    "input_dropped_element": "the dataset loses its first element before batching",
    "ps_step_scheduled_twice": "one parameter-server step scheduled once more than asked",
    "ps_shards_reversed": "the variable partitioner asks for one shard more than the rule",
    "ps_shards_on_one_task": "ParameterServerStrategy's round-robin counter reset before every shard: all on ps task 0",
    "ps_loss_times_two": "compute_average_loss doubled inside a scheduled step",
    "ps_gradient_doubled": "parameter-server gradients doubled before apply_gradients",
    "fit_gradients_doubled": "GradientTape.gradient doubled inside Model.fit's train step",
    "fit_draws_an_iteration_first": "Model.fit draws a first batch from an iteration of its own before it trains",
    "step_local_batch_denominator": "the train step divides each replica's loss by its own batch, not the global one",
    "step_regularization_left_out": "the train step leaves scale_regularization_loss(model.losses) out of the loss",
    "step_one_replica_dropped": "the train step zeroes replica 1's gradients before apply_gradients sums them",
    "step_applies_nothing": "the train step computes the gradients and never calls apply_gradients",
    "counters_not_restored": "the int64 Sum metrics' checkpoint never restored (fresh counters read)",
    "saved_model_before_load": "the SavedModel exported before the trained parameters were loaded",
    "input_fn_global_batch": "the input function batches with the global batch, not get_per_replica_batch_size",
    "values_fn_mirror_ids": "each replica's ValueContext reports the replica id of its mirror image (R-1-id)",
    "input_policy_data": "every dataset's auto-shard policy forced to DATA (FILE sharding never applied)",
    "optimizer_names_extra": "keras.optimizers as if a release exported one more optimizer class",
    "fashion_data_unseeded": "the stand-in Fashion-MNIST data drawn from an unseeded generator",
    "tutorial_restore_skipped": "the tutorial's model evaluated without its checkpoint restored",
    "default_denominator_is_global": "compute_average_loss's default denominator replaced by the all-reduced global batch",
    "checkpoint_without_optimizer": "the restore reads the model and metrics but not the optimizer's slots and iterations",
    "short_batch_dropped": "the training dataset batched with drop_remainder=True: the short last batch never trains",
    "optimizer_outside_scope": "the optimizer created outside strategy.scope(), its variables not distributed",
    "metric_read_before_update": "inside strategy.run the metric is read before this batch's update",
    "optional_iteration_skips_first": "iteration with get_next_as_optional throws the first step away",
    "clipping_dropped": "the optimizer built without its clipnorm/clipvalue/global_clipnorm option",
    "clip_per_replica": "each replica's gradients clipped in the step, before apply_gradients sums them",
    "weight_decay_per_replica": "weight decay applied once per replica (weight_decay x replicas)",
    "step_regularization_not_scaled": "the train step adds model.losses unscaled (counted once per replica)",
    "bn_not_synchronized": "BatchNormalization built without synchronized=True: each replica's own statistics",
    "bn_momentum_inverted": "BatchNormalization's moving statistics updated with momentum 1 - momentum",
    "loss_scale_replica_zero_decides": "non-finite gradients of replicas other than 0 zeroed (unseen by the check)",
    "sparse_duplicates_dropped": "an embedding's sparse gradient keeps only the first occurrence of a repeated index",
    "random_unseeded": "the random layers and generators built without their seed (a new one each build)",
    "random_replica_streams_shared": "every replica's generator and stateless seed the same (replica id not folded in)",
    "ema_momentum_inverted": "the optimizer's EMA built with momentum 1 - ema_momentum",
    "accumulation_one_step_more": "gradient accumulation over one micro-step more than asked",
    "foreign_result": "every number of every probe result moved off its value, every caught exception renamed",
}
