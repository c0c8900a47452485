"""The catalogue of causes the loop check diagnoses: per cause, its title (what the report names),
its fix (what the report tells the user to do), the evidence that names it and its remedy in short
(the two columns of docs/check.md's table, generated from here: ``python -m tests.docs_pages``),
and ``found_by``, the predicates of evidence.py that find it (``evidence`` says in words what they
check). Order: the table's, the loss's causes first, the scripts' last.

Each predicate is evaluated on its own (diagnosis.diagnose); which of the causes found the report
names, and in what order, is declared below the catalogue (``SHOWN``, ``ENDS``, ``SUBSUMES``,
``FALLBACKS``, ``TOGETHER``) and applied after all were evaluated."""

from __future__ import annotations

import dataclasses

from . import evidence as e


@dataclasses.dataclass(frozen=True)
class Cause:
    title: str
    fix: str
    evidence: str = ""  # what must be observed (docs/check.md's evidence column)
    remedy: str = ""  # the fix in short (docs/check.md's fix column)
    scripts: bool = False  # diagnosed only in a training script run unchanged (suite/engine/script/)
    found_by: tuple = ()  # its evidence: predicates of evidence.py (one per way it shows)


CAUSES = {
    "loss_averaged_per_replica": Cause(
        title="loss averaged per replica",
        fix="scale the per-example losses by the global batch: tf.nn.compute_average_loss(per_example_loss, "
            "global_batch_size=GLOBAL_BATCH_SIZE) instead of tf.reduce_mean, so apply_gradients' sum over the "
            "replicas is the global mean",
        evidence="the replicas' returned losses, weight penalty taken out, sum to N x one device's; weighted by each "
                 "replica's examples they give one device's loss exactly (1e-4); and (where the gradients were "
                 "captured) their gradients follow (cosine > 0.99, the same ratio within 5%)",
        remedy="`compute_average_loss(per_example, global_batch_size=G)` instead of `reduce_mean`",
        found_by=(e.loss_averaged_per_replica,)),
    "weighted_loss_normalized_per_replica": Cause(
        title="weighted loss normalised by each replica's own weights",
        fix="divide the weighted per-example losses by the global batch, not by this replica's weights: "
            "tf.nn.compute_average_loss(per_example, sample_weight=w, global_batch_size=GLOBAL_BATCH_SIZE), or, "
            "for a weighted mean, by the weights summed over all replicas (replica_context.all_reduce(SUM, "
            "tf.reduce_sum(w)))",
        evidence="the batch carries example weights (a dict key `sample_weight`/`weight`/`w`, Keras' `(x, y, w)`, or "
                 "`((x, w), y)`); the losses differ from one device's, and weighted by each replica's weight sum "
                 "they give one device's loss exactly (1e-4); the gradients follow",
        remedy="`compute_average_loss(per_example, sample_weight=w, global_batch_size=G)`, or divide by the "
               "all-reduced weight sum",
        found_by=(e.weighted_loss_normalized_per_replica,)),
    "loss_divided_twice": Cause(
        title="loss divided twice",
        fix="divide once: compute_average_loss already divides by the global batch (replicas x local batch); do "
            "not also divide by strategy.num_replicas_in_sync",
        evidence="both ratios equal 1/N",
        remedy="divide once: `compute_average_loss` already divides by the global batch",
        found_by=(e.loss_divided_twice,)),
    "regularization_not_scaled": Cause(
        title="regularization not scaled",
        fix="add tf.nn.scale_regularization_loss(tf.add_n(model.losses)) to the loss, not the bare sum: every "
            "replica adds the penalty and apply_gradients sums them",
        evidence="the loss exceeds one device's by (N - 1) x the weight penalty",
        remedy="`scale_regularization_loss(add_n(model.losses))`",
        found_by=(e.regularization_not_scaled,)),
    "metric_fed_scaled_loss": Cause(
        title="a Mean metric fed scaled losses",
        fix="update the metric with the per-example losses (metric.update_state(per_example_loss)), not with "
            "the replica's scaled loss: a replica's scaled loss is its share of the global mean, and Mean "
            "averages the shares",
        evidence="only metrics differ, by 1/N; not a log a script's own train_step returns to fit (what fit "
                 "reduces over the replicas by itself: a cause of its own, below)",
        remedy="update the metric with the per-example losses",
        found_by=(e.metric_fed_scaled_loss,)),
    "fit_log_reduced_over_replicas": Cause(
        title="a log train_step returns, reduced over the replicas by fit",
        fix="return from train_step, for fit's logs, a value that fit's reduction over the replicas leaves whole: "
            "on Keras 3 (which averages them) a value alike on every replica, a Keras metric's result() (a "
            "keras.metrics.Mean updated with the per-example losses) rather than the replica's scaled loss; on "
            "Keras 2 (which sums them) the replica's share, tf.nn.compute_average_loss, rather than its own mean",
        evidence="only fit's logs differ, each a value the script's own train_step returns (no Keras metric it "
                 "holds), by exactly 1/N (Keras 3's fit averages them: reduce_per_replica, 'auto' is 'mean' off "
                 "TPU) or N (Keras 2's sums them)",
        remedy="return a metric's `result()` (Keras 3), or the replica's share (Keras 2)",
        scripts=True,
        found_by=(e.fit_log_reduced_over_replicas,)),
    "keras_loss_reduction": Cause(
        title="Keras loss object reduces by itself under the strategy",
        fix="create the loss with reduction='none' (keras.losses.Reduction.NONE on Keras 2) and scale the "
            "per-example losses with tf.nn.compute_average_loss; Keras 2 refuses its default reduction inside "
            "strategy.run, Keras 3 averages over the replica's local batch",
        evidence="the x N ratio with a loss object of reduction `sum_over_batch_size`; or the first divergence is a "
                 "short, unevenly split batch with that reduction (Keras 3 divides each replica's mean by N); or the "
                 "step raised Keras 2's \"use Reduction.SUM or NONE\" error",
        remedy="`reduction=\"none\"` and `compute_average_loss`",
        found_by=(e.keras_loss_reduction, e.keras_loss_reduction_short_batch, e.keras_loss_reduction_raised)),
    "created_outside_scope": Cause(
        title="model or optimizer created outside the strategy's scope",
        fix="create the model, the optimizer and the metrics inside `with strategy.scope():` (in the factory), "
            "not at import time or before the scope",
        evidence="a model or optimizer variable for which `variable_created_in_scope` is false",
        remedy="create them in the factory (in the scope), not at import",
        found_by=(e.created_outside_scope,)),
    "lazy_optimizer_build": Cause(
        title="optimizer built lazily inside the distributed step",
        fix="build the optimizer in the scope before the first step: optimizer.build(model.trainable_variables) "
            "(Keras 3), so its slots are made once as distributed variables, not inside strategy.run",
        evidence="its variables appeared in the step and differ. Where the step raises instead (Keras 3.5+ with 2+ "
                 "local devices), the loop is right and BLOCKED by `keras3-lazy-optimizer-slots-mirrored`, this fix "
                 "shown as the way around it (the entry's `workaround`)",
        remedy="`optimizer.build(model.trainable_variables)` in the scope",
        found_by=(e.lazy_optimizer_build, e.lazy_optimizer_build_raised)),
    "clipped_before_aggregation": Cause(
        title="gradients clipped before aggregation",
        fix="clip the summed gradients, not each replica's: with Keras 2 give the optimizer global_clipnorm= "
            "(or clipnorm=) and pass the raw gradients to apply_gradients, which sums the replicas before it "
            "clips; Keras 3's optimizer clips each replica's gradients too (a known deviation of Keras 3), so "
            "there sum them yourself with the replica context's all_reduce, clip the sum with "
            "tf.clip_by_global_norm, and divide out nothing",
        evidence="the losses sum to one device's; every replica handed `apply_gradients` gradients of its own "
                 "direction (they differ between replicas) but of the same global norm, equal to one device's, while "
                 "their sum differs from one device's",
        remedy="clip in the optimizer (`global_clipnorm`), after the sum",
        found_by=(e.clipped_before_aggregation,)),
    "gradients_aggregated_by_hand": Cause(
        title="gradients aggregated by hand before apply_gradients",
        fix="pass each replica's own gradients to optimizer.apply_gradients: it sums them over the replicas "
            "itself; remove the replica_context.all_reduce(SUM, gradients) (or strategy.reduce) before it",
        evidence="the losses sum to one device's; every replica handed `apply_gradients` one device's whole-batch "
                 "gradients (equal to each other and to one device's), and their sum is N x one device's",
        remedy="pass each replica's own gradients: `apply_gradients` sums them",
        found_by=(e.gradients_aggregated_by_hand,)),
    "gradient_of_per_replica_mean": Cause(
        title="gradients taken from a per-replica mean",
        fix="take the gradient of the scaled loss the step returns: "
            "tape.gradient(tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE) + "
            "the scaled penalty, variables), not of tf.reduce_mean(per_example_loss): apply_gradients sums the "
            "replicas' gradients, so each must be its share of the global mean",
        evidence="the losses the replicas returned sum to one device's, yet the gradients they handed "
                 "`apply_gradients` differ from each other and from one device's whole-batch gradients and sum to N "
                 "x one device's (cosine > 0.99)",
        remedy="the gradient of the scaled loss the step returns (`compute_average_loss(..., "
               "global_batch_size=G)`), not of `reduce_mean`",
        found_by=(e.gradient_of_per_replica_mean,)),
    "optimizer_scaled_by_replicas": Cause(
        title="optimizer hyper-parameters scaled by the replica count",
        fix="keep one device's learning rate (and other step sizes): the loss is already the global batch's "
            "mean, so the gradients apply_gradients sums are one device's; do not multiply the learning rate by "
            "strategy.num_replicas_in_sync",
        evidence="the losses and the summed gradients equal one device's, yet every differing variable moved N x one "
                 "device's update (an optimizer variable such as the learning rate N x one device's from step 1 is "
                 "shown too)",
        remedy="keep one device's learning rate",
        found_by=(e.optimizer_scaled_by_replicas,)),
    "shuffled_per_worker_before_sharding": Cause(
        title="input shuffled per worker before sharding",
        fix="shard before shuffling (tf.data.Dataset.shard: 'Be sure to shard before you use any randomizing "
            "operator (such as shuffle)'), or give the shuffle a seed every worker shares: shuffle(buffer_size, "
            "seed=...)",
        evidence="on 2 or more workers, step 1 differs and the script shuffled without a seed a dataset it shards "
                 "after (by hand or by `experimental_distribute_dataset`'s auto-sharding): each worker, a process of "
                 "its own, shuffles its own way, so the shards overlap",
        remedy="shard before shuffling, or `shuffle(n, seed=...)` with a seed every worker shares",
        scripts=True,
        found_by=(e.shuffled_per_worker_before_sharding,)),
    "input_not_sharded_per_worker": Cause(
        title="input not sharded per worker",
        fix="give each worker its own examples: in the dataset function of distribute_datasets_from_function, "
            "ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id) before batching; with "
            "experimental_distribute_dataset, leave auto-sharding on (not AutoShardPolicy.OFF)",
        evidence="on 2 or more workers, every worker's replicas got worker 0's examples: the digests of the examples "
                 "each replica drew (equal losses prove nothing where a loss reads no example, a GAN's generator fed "
                 "noise); where none were read (a coordinator's remote values), its replicas returned worker 0's "
                 "losses and gradients bit for bit",
        remedy="`ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)` in the dataset "
               "function",
        found_by=(e.input_not_sharded_per_worker,)),
    "per_replica_batch_norm": Cause(
        title="per-replica BatchNormalization where global statistics were expected",
        fix="use keras.layers.BatchNormalization(synchronized=True) so every replica normalizes with the global "
            "batch's mean and variance, as one device does",
        evidence="an unsynchronized BatchNormalization layer, several replicas, and the divergence shows in that "
                 "layer's moving statistics (no other cause)",
        remedy="`BatchNormalization(synchronized=True)`",
        found_by=(e.per_replica_batch_norm,)),
    "identical_dropout_masks": Cause(
        title="identical dropout masks across replicas",
        fix="give each replica its own random stream: for a layer of your own, draw from a tf.random.Generator "
            "created in the scope, or fold the replica id "
            "(tf.distribute.get_replica_context().replica_id_in_sync_group) into a stateless seed",
        evidence="random layers, several replicas, identical training-mode outputs for the same input, which no "
                 "known deviation explains (a layer of the user's own)",
        remedy="a per-replica stream: a `tf.random.Generator` made in the scope, or the replica id folded into a "
               "stateless seed",
        found_by=(e.identical_dropout_masks,)),
    "per_replica_batch_size": Cause(
        title="dataset batched with the per-replica size",
        fix="batch the dataset given to experimental_distribute_dataset with the global batch size (per-replica "
            "size x strategy.num_replicas_in_sync); the strategy splits each global batch among the replicas",
        evidence="the replicas' examples in a step sum to one device's / N",
        remedy="batch with the global batch size",
        found_by=(e.per_replica_batch_size,)),
    "short_batch_weighted_differently": Cause(
        title="short last batch weighted differently",
        fix="pass global_batch_size= to tf.nn.compute_average_loss (its default, replicas x local batch, weighs "
            "a short, unevenly split batch's examples by their replica's share), or drop the remainder",
        evidence="earlier (full, evenly split) steps agreed; the first divergence is a short batch split unevenly",
        remedy="`global_batch_size=` in `compute_average_loss`, or drop the remainder",
        found_by=(e.short_batch_weighted_differently,)),
    "reduce_mean_for_sum": Cause(
        title="strategy.reduce MEAN where SUM was meant",
        fix="report the step's loss with strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, "
            "axis=None): each replica's loss is already its share of the global mean",
        evidence="the reported loss is 1/N of one device's while the replicas' losses sum to it, and the loop "
                 "reduces with MEAN",
        remedy="`strategy.reduce(SUM, ...)`",
        found_by=(e.reduce_mean_for_sum,)),
    "replicas_disagree": Cause(
        title="variables that differ between replicas",
        fix="update a variable from every replica with the same value: create it in the scope with its default "
            "synchronization, and change it through the optimizer or with an all-reduced value, not from each "
            "replica's own data",
        evidence="a variable's copies differ between replicas, with no other cause",
        remedy="update it with one value for all replicas",
        found_by=(e.replicas_disagree,)),
    "batch_not_distributed": Cause(
        title="batches not distributed",
        fix="distribute the dataset: iterate strategy.experimental_distribute_dataset(dataset) (or "
            "strategy.distribute_datasets_from_function) and pass its elements to strategy.run; a plain batch "
            "passed to strategy.run goes whole to every replica, so apply_gradients sums the replica count's "
            "copies of it",
        evidence="the script passed `strategy.run` a batch that is no distributed dataset's element, so every "
                 "replica got all of it (the replicas' losses sum to N x one device's)",
        remedy="iterate `strategy.experimental_distribute_dataset(dataset)`",
        scripts=True,
        found_by=(e.batch_not_distributed,)),
    "metric_from_one_replica": Cause(
        title="a metric fed one replica's value",
        fix="feed the metric the value of every replica: strategy.reduce(tf.distribute.ReduceOp.SUM, "
            "per_replica_loss, axis=None) in the cross-replica context (or update the metric inside "
            "strategy.run, where each replica adds its own), not "
            "strategy.experimental_local_results(per_replica_loss)[0]",
        evidence="only metrics differ; a mean metric's value is the mean of one replica's values the script read "
                 "with `experimental_local_results`, not of all replicas'; or a value the script read by index of "
                 "`experimental_local_results` (`[0]`, compared as a metric with what one device read there) differs "
                 "from one device's",
        remedy="`strategy.reduce(SUM, ...)`, or update the metric inside `strategy.run`",
        scripts=True,
        found_by=(e.metric_from_one_replica, e.local_result_of_one_replica)),
}


# -- which causes found the report names, and in what order ------------------------------------
# the order the report lists the causes found (each predicate's place; a cause found several ways
# is named once, at its first place); the table of docs/check.md keeps the catalogue's order
SHOWN = (
    e.created_outside_scope,
    e.batch_not_distributed,
    e.keras_loss_reduction_raised,
    e.lazy_optimizer_build_raised,
    e.identical_dropout_masks,
    e.per_replica_batch_size,
    e.lazy_optimizer_build,
    (e.metric_from_one_replica, e.metric_fed_scaled_loss),  # one place: see TOGETHER
    e.fit_log_reduced_over_replicas,
    e.local_result_of_one_replica,
    e.weighted_loss_normalized_per_replica,
    e.keras_loss_reduction,
    e.loss_averaged_per_replica,
    e.loss_divided_twice,
    e.gradients_aggregated_by_hand,
    e.clipped_before_aggregation,
    e.gradient_of_per_replica_mean,
    e.optimizer_scaled_by_replicas,
    e.shuffled_per_worker_before_sharding,
    e.input_not_sharded_per_worker,
    e.regularization_not_scaled,
    e.reduce_mean_for_sum,
    e.per_replica_batch_norm,
    e.keras_loss_reduction_short_batch,
    e.short_batch_weighted_differently,
    e.replicas_disagree,
)

# a root cause: where it holds, nothing after it in SHOWN is named (all else that differs follows from it)
ENDS = (e.batch_not_distributed, e.per_replica_batch_size)

# where the first holds, the others are not named: the same evidence read a stronger way (weights
# that are all one give by_weights = by_rows; replicas' gradients equal to one device's within 1e-3
# each may differ from each other by 2e-3)
SUBSUMES = {
    e.weighted_loss_normalized_per_replica: (e.keras_loss_reduction, e.loss_averaged_per_replica,
                                             e.loss_divided_twice),
    e.keras_loss_reduction: (e.loss_divided_twice,),
    e.loss_averaged_per_replica: (e.loss_divided_twice,),
    e.gradients_aggregated_by_hand: (e.clipped_before_aggregation, e.gradient_of_per_replica_mean),
    e.clipped_before_aggregation: (e.gradient_of_per_replica_mean,),
}

# named only where no cause listed before it in SHOWN is: the explanation of what is left
FALLBACKS = (e.reduce_mean_for_sum, e.per_replica_batch_norm, e.keras_loss_reduction_short_batch,
             e.short_batch_weighted_differently, e.replicas_disagree)

# the order among the predicates of one place in SHOWN: ``key(observed, predicate)``, smallest first
TOGETHER = {(e.metric_from_one_replica, e.metric_fed_scaled_loss): e.first_metric}


def table() -> list[str]:
    """docs/check.md's table of diagnoses: a row per cause, in the catalogue's order."""
    rows = ["| cause | evidence | fix |", "| --- | --- | --- |"]
    for cause in CAUSES.values():
        title = cause.title + (" (scripts)" if cause.scripts else "")
        rows.append(f"| {title} | {cause.evidence} | {cause.remedy} |")
    return rows
