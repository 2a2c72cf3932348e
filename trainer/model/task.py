"""`Task`: the per-replica maths of one training problem.

A Task says what to train (model, data, losses, metrics, optimizer) and what
one replica does in one step. The framework owns everything around it:
batching and splitting the data over replicas, `strategy.run`, the reduction
across replicas, the global step, checkpoints and summaries. Hook names follow
Model Garden's `official.core.base_task.Task`, so its users recognise them.
"""

import dataclasses
import functools
from typing import Any, Dict, List, Optional, Tuple, Union

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import graph_code
from trainer.distribute import placement
from trainer.model import gradients
from trainer.model import named
from trainer.model import optimization
from trainer.model import warm_start as warm_start_lib
from trainer.storage import exports

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
  ) -> Union[tf.data.Dataset, Dict[str, tf.data.Dataset]]:
    """Returns a dataset of single examples; the framework batches it, then
    applies `preprocess_batch` to each batch.

    For evaluation it may return several named sets, `{"clean": ds1,
    "noisy": ds2}`: every evaluation evaluates each with fresh metrics
    (`build_metrics`, `validation_step`, `aggregate_logs` and
    `reduce_aggregated_logs` per set), its results are named
    `<set>/<metric>` (`clean/accuracy`) and its summaries go to
    `eval/<set>` (see `trainer.data.eval_sets`). A name is letters, digits,
    `_`, `-` and `.`.

    Args:
      training: True for the training split (the framework repeats it; it
        may also be endless, one shuffled epoch after another), False
        for the evaluation split (read once, partial last batch included).
      input_context: Which input pipeline this is and how many exist; a task
        reading many files may shard by file with it. The framework does not
        shard again.

    Examples held as blocks (tensors stacked on a leading axis) are best
    returned as `trainer.data.inputs.examples_from_blocks(blocks)`: the
    framework then batches them a block at a time.

    For training, a dict of such datasets by name is a mixture: their
    examples are drawn one by one at the rates of `trainer.mixture` (or
    `mixture_rates`), and the train summaries show each source's share
    and mean loss (`trainer.data.mixture`; the loss where `train_step`
    returns `per_example_loss`, as the default does). Blocks are read as
    single examples there.
    """
    raise NotImplementedError(
        f"{type(self).__name__} must define build_inputs.")

  def mixture_rates(self) -> Optional[Dict[str, float]]:
    """Returns the rates of the training sources by name, where
    `build_inputs(training=True)` returns a dict of datasets; None (the
    default) leaves them to `trainer.mixture`, which wins where both give
    rates.

    Each source's share of the training examples is its rate over their
    sum; 0 leaves a source out (`trainer.data.mixture`).
    """
    return None

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
    checkpoint, into the model (or each of the models) `warm_start.model`
    names where there are several. An override should call
    `super().initialize(...)` to keep warm starts working.
    """
    if warm_start is None or warm_start.checkpoint is None:
      return
    for name in warm_start.models:
      named.check_choice("warm_start.model", name, model)
      warm_start_lib.restore(model[name] if named.several(model) else model,
                             dataclasses.replace(warm_start, model=name))

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

  @graph_code.written_for_graphs
  def process_metrics(self, metrics, labels, model_outputs) -> None:
    """Updates each metric with a batch of labels and outputs."""
    for metric in metrics:
      metric.update_state(labels, model_outputs)

  @graph_code.written_for_graphs
  def train_step(self, inputs, model: tf_keras.Model,
                 optimizer: tf_keras.optimizers.Optimizer,
                 metrics: Optional[List[tf_keras.metrics.Metric]] = None,
                 options: Optional[gradients.StepOptions] = None) -> Logs:
    """Runs one training step on one replica's slice of the global batch.

    The default runs `compute_gradients` on each micro-batch, sums the
    gradients over micro-batches and replicas, clips them and applies them
    (see `trainer.model.gradients`). A task overriding this receives no
    `options` (so gradient accumulation, clipping and XLA on several replicas
    are refused for it) unless it calls `super().train_step(...)` itself.

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
      `per_example_loss` (only where `options.report_per_example_loss`: the
      framework asks for it when it trains on a mixture) holds
      `build_losses`' loss of each example of `inputs`, shape [the
      replica's batch], in the examples' order; the train summaries show
      each source's mean of it as `mixture/<name>/loss`. An override may
      return the same key, with the same meaning, to get those summaries.
    """
    options = options or gradients.StepOptions()
    # A subclass's hooks are converted by autograph (`graph_code`).
    process_metrics = graph_code.user_code(self.process_metrics)
    build_losses = graph_code.user_code(self.build_losses)

    @graph_code.written_for_graphs
    def on_outputs(batch, outputs):
      process_metrics(metrics or [], batch[1], outputs)
      if not options.report_per_example_loss:
        return None
      # Evaluated again on the outputs: `compute_gradients` (which a Task
      # may override) returns only their mean.
      return gradients.per_example(build_losses(batch[1], outputs))

    loss, grads, per_example_loss = gradients.accumulate(
        options.gradient_fn or self.compute_gradients, inputs, model,
        optimizer, options.accumulation_steps, on_outputs)
    norm = gradients.clip_and_apply(optimizer, grads,
                                    model.trainable_variables, options)
    if not isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
      # A non-finite gradient makes the step's loss NaN, so the framework's
      # guard stops at this step rather than one later. (Dynamic loss
      # scaling expects such gradients and skips those steps itself.)
      loss = tf.where(tf.math.is_finite(norm), loss,
                      tf.constant(float("nan"), loss.dtype))
    logs = {"loss": loss, "gradient_norm": norm}
    if per_example_loss is not None:
      logs[gradients.PER_EXAMPLE_LOSS] = per_example_loss
    return logs

  @graph_code.written_for_graphs
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
      per_example_loss = graph_code.user_code(self.build_losses)(labels,
                                                                 outputs)
      loss = tf.nn.compute_average_loss(per_example_loss)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      is_loss_scaled = isinstance(optimizer,
                                  tf_keras.mixed_precision.LossScaleOptimizer)
      tape_loss = optimizer.get_scaled_loss(loss) if is_loss_scaled else loss
    # On each part's device when the model is split
    # (`trainer.distribute.placement`).
    grads = placement.gradients(tape, tape_loss, model.trainable_variables)
    if is_loss_scaled:
      grads = optimizer.get_unscaled_gradients(grads)
    return loss, grads, outputs

  def validation_step(self, inputs, model: tf_keras.Model,
                      metrics: Optional[List[tf_keras.metrics.Metric]] = None
                      ) -> Logs:
    """Runs one evaluation step on one replica's slice of a batch.

    The slice is `eval_batch_size` over the replicas, but the partial last
    batch is split as evenly as it goes (9 examples on 2 replicas: 5 and
    4). A replica left with no example (a last batch smaller than the
    replica count) does not call it, so on several replicas it must not
    synchronise them (an all-reduce).

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
    Each value of `step_logs` is a tuple with one tensor per local replica;
    a replica given no example of the step (it did not call
    `validation_step`) has an empty one: no row, or 0 for a scalar.
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


@graph_code.written_for_graphs
def float32_outputs(outputs):
  """Casts every floating tensor of `outputs` to float32.

  Under `runtime.mixed_precision_dtype` float16 or bfloat16 a model computes
  in that type; losses and metrics must see float32 (what the default steps
  pass to `build_losses`). Call it in an overridden step too.
  """
  return tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


def _checked_losses(build_losses):
  """Wraps a `build_losses` so that a scalar result, or labels broadcast
  against the outputs into a [batch, batch] loss, raise `ConfigError`."""
  if getattr(build_losses, "_checks_rank", False):
    return build_losses

  @graph_code.written_for_graphs
  @functools.wraps(build_losses)
  def checked(self, *args, **kwargs):
    losses = graph_code.user_code(build_losses)(self, *args, **kwargs)
    if getattr(getattr(losses, "shape", None), "rank", None) == 0:
      raise errors.ConfigError(
          f"{type(self).__name__}.build_losses returned a scalar: return "
          "per-example losses, shape [batch] (drop the final mean; the "
          "framework averages over the global batch).")
    return _checked_alignment(self, build_losses, losses, args, kwargs)

  checked._checks_rank = True  # pylint: disable=protected-access
  return checked


# Begins and ends the message of the assertion `_checked_alignment` adds to
# a traced step, so that `broadcast_error` finds it in TensorFlow's error.
_BROADCAST = ("<<build_losses broadcast: ", ">>")


@graph_code.written_for_graphs
def _one_apart(shorter: tf.TensorShape, longer: tf.TensorShape) -> bool:
  """Whether `longer` is `shorter` with a trailing axis of 1."""
  return (shorter.rank is not None and longer.rank == shorter.rank + 1 and
          shorter.rank >= 1 and longer[-1] == 1 and
          longer[:-1].is_compatible_with(shorter))


@graph_code.written_for_graphs
def _checked_alignment(task: "Task", build_losses, losses, args, kwargs):
  """Returns `losses`, checked for labels that broadcast against outputs.

  Labels of shape [batch] against outputs [batch, 1] (or the reverse) make
  `labels - outputs` a [batch, batch] tensor; a mean over its last axis
  still gives [batch] losses, each mixing every example's label, and the
  loss stops falling without a word. Keras's losses squeeze such an axis;
  a hand-written one does not. Checked only for shapes one trailing 1
  apart: there, the first example's loss computed alone must equal its loss
  in the batch (eagerly at once; traced, by an assertion that
  `broadcast_error` turns into the same line).
  """
  labels = args[0] if args else kwargs.get("labels")
  outputs = args[1] if len(args) > 1 else kwargs.get("model_outputs")
  if not (tf.is_tensor(labels) and tf.is_tensor(outputs) and
          tf.is_tensor(losses) and losses.shape.rank == 1 and
          (_one_apart(labels.shape, outputs.shape) or
           _one_apart(outputs.shape, labels.shape))):
    return losses
  rest = dict(kwargs)
  rest.pop("labels", None)
  rest.pop("model_outputs", None)
  alone = graph_code.user_code(build_losses)(task, labels[:1], outputs[:1],
                                             *args[2:], **rest)
  first = tf.cast(losses[:1], tf.float32)
  alone = tf.cast(tf.reshape(alone, [-1])[:1], tf.float32)
  aligned = tf.reduce_all(
      tf.abs(first - alone) <= 1e-3 * tf.abs(alone) + 1e-5)
  message = (
      f"{type(task).__name__}.build_losses: labels of shape "
      f"{_shape_text(labels)} and outputs of shape "
      f"{_shape_text(outputs)} broadcast into a [batch, batch] loss (each "
      "example's loss mixes every label): give the labels the outputs' "
      "shape (`labels = tf.reshape(labels, tf.shape(model_outputs))`) or "
      "drop the outputs' last axis of 1.")
  if tf.executing_eagerly():
    if not bool(aligned):
      raise errors.ConfigError(message)
    return losses
  check = tf.debugging.Assert(aligned, [_BROADCAST[0] + message +
                                        _BROADCAST[1]])
  with tf.control_dependencies([check]):
    return tf.identity(losses)


def _shape_text(tensor) -> str:
  """`[64, 1]`, or `[batch, 1]` where the batch size is not static."""
  return "[" + ", ".join("batch" if d is None else str(d)
                         for d in tensor.shape.as_list()) + "]"


def broadcast_error(error: BaseException) -> Optional[errors.ConfigError]:
  """The `ConfigError` for a traced step's failed alignment assertion
  (`_checked_alignment`) behind `error`, else None."""
  message = getattr(error, "message", None) or str(error)
  start = message.find(_BROADCAST[0])
  end = message.find(_BROADCAST[1], start)
  if start < 0 or end < 0:
    return None
  # TensorFlow prints the assertion's string with its quotes escaped.
  return errors.ConfigError(
      message[start + len(_BROADCAST[0]):end].replace("\\'", "'"))


def overrides(task: Task, hook: str) -> bool:
  """Whether `task`'s class replaces `Task.<hook>` (the framework skips the
  work a hook's default does not need)."""
  return getattr(type(task), hook) is not getattr(Task, hook)
