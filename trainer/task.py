"""`Task`: the per-replica maths of one training problem.

A Task says what to train (model, data, losses, metrics, optimizer) and what
one replica does in one step. The framework owns everything around it:
batching and splitting the data over replicas, `strategy.run`, the reduction
across replicas, the global step, checkpoints and summaries. Hook names follow
Model Garden's `official.core.base_task.Task`, so its users recognise them.
"""

import functools
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import exports
from trainer import gradients
from trainer import named
from trainer import optimization
from trainer import placement
from trainer import warm_start as warm_start_lib

Logs = Dict[str, Any]


class Task:
  """Base class of every trainable problem; override what differs.

  Most tasks override `build_model`, `build_inputs`, `build_losses` and
  `build_metrics`, and inherit the default steps, which scale the loss by the
  GLOBAL batch so that a step does the same update on 1 or N replicas.

  Inputs are `(features, labels)` pairs unless a task overrides the steps.

  A subclass's `build_losses` is checked wherever it is called (in the
  default steps or in the task's own): a scalar instead of per-example
  losses is a one-line error naming it, not TensorFlow's complaint about
  `per_example_loss` deep inside a step, or a silently wrong loss.
  """

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if "build_losses" in cls.__dict__:
      cls.build_losses = _checked_losses(cls.__dict__["build_losses"])

  def build_model(self) -> tf_keras.Model:
    """Returns the model; called once, inside the strategy scope."""
    raise NotImplementedError(f"{type(self).__name__} must define build_model.")

  def build_inputs(
      self, training: bool,
      input_context: Optional[tf.distribute.InputContext] = None
  ) -> tf.data.Dataset:
    """Returns a dataset of single examples; the framework batches it, then
    applies `preprocess_batch` to each batch.

    Args:
      training: True for the training split (the framework repeats it; it
        may also be endless, one shuffled epoch after another), False
        for the evaluation split (read once, partial last batch included).
      input_context: Which input pipeline this is and how many exist; a task
        reading many files may shard by file with it. The framework does not
        shard again.

    Examples held as blocks (tensors stacked on a leading axis) are best
    returned as `trainer.inputs.examples_from_blocks(blocks)`: the framework
    then batches them a block at a time.
    """
    raise NotImplementedError(
        f"{type(self).__name__} must define build_inputs.")

  def preprocess_batch(self, batch, training: bool, seed: tf.Tensor):
    """Transforms a batch of one input pipeline, right after batching.

    Work done here on a whole batch at once (gathering images from memory,
    augmenting them, casting) costs a few ops per batch instead of a few per
    example in `build_inputs`'s `map`: on a busy CPU that is the difference
    between an input pipeline that slows training and one that does not.
    Only an override is applied.

    Args:
      batch: A batch of what `build_inputs` returns (of this worker's share
        of the global batch).
      training: Which split.
      seed: A stateless seed, shape [2], different for every batch and
        input pipeline and restored with the input position.

    Returns:
      The `(features, labels)` batch.
    """
    del training, seed
    return batch

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """Returns PER-EXAMPLE losses, shape `[batch]`.

    The default steps average them over the global batch; `aux_losses` (the
    model's regularisation losses) are added by the steps, not here.
    """
    raise NotImplementedError(
        f"{type(self).__name__} must define build_losses.")

  def build_metrics(self,
                    training: bool = True) -> List[tf_keras.metrics.Metric]:
    """Returns metrics updated by `process_metrics`; none by default."""
    del training
    return []

  def create_optimizer(self, settings: optimization.Settings
                       ) -> tf_keras.optimizers.Optimizer:
    """Returns the optimizer; called once, inside the strategy scope.

    The default builds what gin's `optimizer.*` and `learning_rate.*`
    describe (Model Garden's optimizers and schedules). The framework then
    applies batch scaling, EMA (`ema.*`) and float16 loss scaling to
    whatever this returns.
    """
    return settings.build()

  def initialize(self, model: tf_keras.Model,
                 warm_start: Optional[warm_start_lib.WarmStartConfig] = None
                 ) -> None:
    """Initialises a new run's model; called only when training starts from
    scratch (a restarted run restores its own checkpoint instead).

    The default loads `warm_start` (gin's `warm_start.*`) if it names a
    checkpoint, into the model `warm_start.model` names where there are
    several. An override should call `super().initialize(...)` to keep
    warm starts working.
    """
    if warm_start is None or warm_start.checkpoint is None:
      return
    named.check_choice("warm_start.model", warm_start.model, model)
    warm_start_lib.restore(
        model[warm_start.model] if named.several(model) else model,
        warm_start)

  def export_signatures(self, model: tf_keras.Model,
                        features_spec) -> exports.Signatures:
    """Returns the signatures of the SavedModels the framework exports.

    Args:
      model: The model, holding the weights to export.
      features_spec: The eval input's features (`tf.TensorSpec`s with a
        `None` batch dimension).

    Returns:
      Signature name -> `tf.function` with an input signature. The default
      is `serving_default`: the model's inference call on a batch.
    """
    return exports.default_signatures(model, features_spec)

  def process_metrics(self, metrics, labels, model_outputs) -> None:
    """Updates each metric with a batch of labels and outputs."""
    for metric in metrics:
      metric.update_state(labels, model_outputs)

  def train_step(self, inputs, model: tf_keras.Model,
                 optimizer: tf_keras.optimizers.Optimizer,
                 metrics: Optional[List[tf_keras.metrics.Metric]] = None,
                 options: Optional[gradients.StepOptions] = None) -> Logs:
    """Runs one training step on one replica's slice of the global batch.

    The default runs `compute_gradients` on each micro-batch, sums the
    gradients over micro-batches and replicas, clips them and applies them
    (see `trainer.gradients`). A task overriding this receives no `options`
    (so gradient accumulation, clipping and XLA on several replicas are
    refused for it) unless it calls `super().train_step(...)` itself.

    Args:
      inputs: This replica's `(features, labels)`.
      model: The model.
      optimizer: Applies the gradients.
      metrics: Updated with the step's labels and outputs.
      options: Micro-batches, clipping and a stand-in for
        `compute_gradients`; the framework builds them from `trainer.*`.

    Returns:
      Logs whose `loss` is this replica's share of the global mean loss: the
      per-example losses summed and divided by the GLOBAL batch size, plus the
      regularisation losses divided by the replica count. The framework sums
      `loss` over replicas, which gives the global mean. `gradient_norm` is
      the global norm of the summed gradients before clipping.
    """
    options = options or gradients.StepOptions()
    loss, grads = gradients.accumulate(
        options.gradient_fn or self.compute_gradients, inputs, model,
        optimizer, options.accumulation_steps,
        lambda batch, outputs: self.process_metrics(metrics or [], batch[1],
                                                    outputs))
    norm = gradients.clip_and_apply(optimizer, grads,
                                    model.trainable_variables, options)
    if not isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
      # A non-finite gradient makes the step's loss NaN, so the framework's
      # guard stops at this step rather than one later. (Dynamic loss
      # scaling expects such gradients and skips those steps itself.)
      loss = tf.where(tf.math.is_finite(norm), loss,
                      tf.constant(float("nan"), loss.dtype))
    return {"loss": loss, "gradient_norm": norm}

  def compute_gradients(self, inputs, model: tf_keras.Model,
                        optimizer: tf_keras.optimizers.Optimizer
                        ) -> Tuple[tf.Tensor, List[tf.Tensor], Any]:
    """Runs the forward and backward pass of `train_step` on one batch.

    Called once per micro-batch. With `runtime.enable_xla` on several
    replicas, this part is what XLA compiles; summing and applying the
    gradients (which synchronises replicas) runs outside.

    Returns:
      `(loss, gradients of model.trainable_variables, model outputs)`, the
      loss scaled as `train_step` describes and the gradients unscaled
      (divided back by the float16 loss scale).
    """
    features, labels = inputs
    with tf.GradientTape() as tape:
      outputs = float32_outputs(model(features, training=True))
      per_example_loss = self.build_losses(labels, outputs)
      loss = tf.nn.compute_average_loss(per_example_loss)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      is_loss_scaled = isinstance(optimizer,
                                  tf_keras.mixed_precision.LossScaleOptimizer)
      tape_loss = optimizer.get_scaled_loss(loss) if is_loss_scaled else loss
    # On each part's device when the model is split (`trainer.placement`).
    grads = placement.gradients(tape, tape_loss, model.trainable_variables)
    if is_loss_scaled:
      grads = optimizer.get_unscaled_gradients(grads)
    return loss, grads, outputs

  def validation_step(self, inputs, model: tf_keras.Model,
                      metrics: Optional[List[tf_keras.metrics.Metric]] = None
                      ) -> Logs:
    """Runs one evaluation step on one replica's slice of a batch.

    Returns:
      Logs whose `loss` holds the per-example losses; the framework averages
      them over every evaluated example. Other entries are handed to
      `aggregate_logs`.
    """
    features, labels = inputs
    outputs = float32_outputs(model(features, training=False))
    self.process_metrics(metrics or [], labels, outputs)
    return {"loss": self.build_losses(labels, outputs)}

  def aggregate_logs(self, state: Any = None, step_logs: Any = None) -> Any:
    """Folds one eval step's logs into `state`, eagerly, as in Model Garden.

    Override to compute metrics that need every output (AUC over the whole
    set, a confusion matrix). Called once per eval step, in order: the first
    step's call gets `state=None` (create the state then), each later one
    the value the previous call returned; the last value goes to
    `reduce_aggregated_logs`.
    Each value of `step_logs` is a tuple with one tensor per local replica.
    """
    del step_logs
    return state

  def reduce_aggregated_logs(self, aggregated_logs: Any,
                             global_step: Optional[tf.Tensor] = None
                             ) -> Dict[str, Any]:
    """Turns the state built by `aggregate_logs` into named eval results.

    A scalar is reported and summarised like the metrics; an image
    (`[height, width, channels]`, values in [0, 1]) becomes an image
    summary in `model_dir/eval` and `model_dir/eval/images/<name>-<step>.png`.
    """
    del aggregated_logs, global_step
    return {}


def float32_outputs(outputs):
  """Casts every floating tensor of `outputs` to float32.

  Under `runtime.mixed_precision_dtype` float16 or bfloat16 a model computes
  in that type; losses and metrics must see float32 (what the default steps
  pass to `build_losses`). Call it in an overridden step too.
  """
  return tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


def _checked_losses(build_losses):
  """Wraps a `build_losses` so that a scalar result raises `ConfigError`."""
  if getattr(build_losses, "_checks_rank", False):
    return build_losses

  @functools.wraps(build_losses)
  def checked(self, *args, **kwargs):
    losses = build_losses(self, *args, **kwargs)
    if getattr(getattr(losses, "shape", None), "rank", None) == 0:
      raise errors.ConfigError(
          f"{type(self).__name__}.build_losses returned a scalar: return "
          "per-example losses, shape [batch] (drop the final mean; the "
          "framework averages over the global batch).")
    return losses

  checked._checks_rank = True  # pylint: disable=protected-access
  return checked


def overrides(task: Task, hook: str) -> bool:
  """Whether `task`'s class replaces `Task.<hook>` (the framework skips the
  work a hook's default does not need)."""
  return getattr(type(task), hook) is not getattr(Task, hook)
