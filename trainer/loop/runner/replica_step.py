"""The per-replica training step: a Task's `train_step` and what it gets.

The default `Task.train_step` gets the step options (micro-batches,
clipping, an XLA-compiled gradient pass); an override gets nothing, and the
settings that need the default step are refused. With several models
(`trainer.model.named`) the framework cuts the micro-batches itself and reports
each model's gradient norm.
"""

import dataclasses
from typing import Callable, Dict, Mapping, Optional

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import graph_code
from trainer.model import gradients
from trainer.model import named
from trainer.model import task as task_lib


def build(task: task_lib.Task, model, optimizer, metrics,
          options: gradients.StepOptions, *, per_replica_batch_size: int,
          num_replicas: int, enable_xla: bool,
          model_options: Optional[Mapping[str, gradients.StepOptions]] = None,
          per_example_loss: bool = False) -> Callable:
  """Returns the per-replica step, `step(inputs) -> logs`.

  Args:
    task: Supplies `train_step`.
    model: The model, or models by name.
    optimizer: The optimizer, or optimizers by name.
    metrics: The training metrics.
    options: Micro-batches and clipping for the default `Task.train_step`.
    per_replica_batch_size: Examples per replica and step.
    num_replicas: Replicas in sync.
    enable_xla: Compile the step with XLA (on several replicas, its
      gradient pass only).
    model_options: With several models, the options `trainer.minimize`
      applies with each model's optimizer (its clipping), by model name;
      none: no clipping.
    per_example_loss: Ask the default `Task.train_step` for its
      per-example losses (`gradients.PER_EXAMPLE_LOSS`); an own step
      returns them or not, as it was written.

  Raises:
    errors.ConfigError: If micro-batches do not divide the per-replica
      batch, or the task overrides `train_step` but the settings need the
      default one.
  """
  if enable_xla and num_replicas > 1:
    # A whole step cannot be compiled on several replicas: summing the
    # gradients synchronises them. The forward and backward pass can.
    options = dataclasses.replace(
        options, gradient_fn=tf.function(task.compute_gradients,
                                         jit_compile=True))
  _check(task, model, options, per_replica_batch_size)
  if per_example_loss and not task_lib.overrides(task, "train_step"):
    options = dataclasses.replace(options, report_per_example_loss=True)
  step = _TaskStep(task, model, optimizer, metrics, options,
                   model_options or {})
  if enable_xla and num_replicas == 1:
    return tf.function(step.__call__, jit_compile=True)
  return step.__call__


def _check(task: task_lib.Task, model, options: gradients.StepOptions,
           per_replica_batch_size: int) -> None:
  """Refuses settings the task's step cannot take; see `build`."""
  if per_replica_batch_size % options.accumulation_steps:
    raise errors.ConfigError(
        f"`trainer.global_batch_size` gives {per_replica_batch_size} "
        "example(s) per replica, which do not split into `trainer.gradient_"
        f"accumulation_steps` ({options.accumulation_steps}) equal "
        "micro-batches.")
  overridden = task_lib.overrides(task, "train_step")
  if named.several(model) and not overridden:
    raise errors.ConfigError(
        f"{type(task).__name__} builds several models "
        f"({', '.join(model)}): it must override `train_step`, which "
        "gets them and their optimizers by name.")
  if not overridden:
    return
  if named.several(model):
    # Clipping applies in `trainer.minimize`, per model (`trainer.state`);
    # micro-batches in `_TaskStep`.
    if options.gradient_fn is not None:
      raise errors.ConfigError(
          "`runtime.enable_xla` on several replicas compiles the default "
          "train_step's gradient pass; a Task with several models runs "
          "its own step: use one replica, or no XLA.")
  elif options != gradients.StepOptions():
    raise errors.ConfigError(
        f"{type(task).__name__} overrides `Task.train_step`, which "
        "then does its own gradient handling: `trainer.gradient_"
        "accumulation_steps`, `trainer.gradient_clip_norm`/`_value` and "
        "`runtime.enable_xla` on several replicas need the default step.")


class _TaskStep:
  """Calls the Task's `train_step` on one replica's batch."""

  def __init__(self, task: task_lib.Task, model, optimizer, metrics,
               options: gradients.StepOptions,
               model_options: Mapping[str, gradients.StepOptions]):
    self._task = task
    self._model = model
    self._optimizer = optimizer
    self._metrics = metrics
    # With several models, each one's options for `trainer.minimize`.
    self._model_options = model_options
    # Only the default `train_step` takes `options`; others get nothing.
    self._kwargs = ({} if task_lib.overrides(task, "train_step")
                    else {"options": options})
    # With several models the framework cuts the micro-batches itself.
    self._accumulation_steps = options.accumulation_steps

  def __call__(self, inputs):
    if not named.several(self._optimizer):
      return self._task.train_step(inputs, self._model, self._optimizer,
                                   self._metrics, **self._kwargs)
    if self._accumulation_steps > 1:
      logs, norms = gradients.accumulate_updates(
          lambda batch, record: self._task.train_step(
              batch, self._model, self._optimizers(record), self._metrics),
          inputs, self._accumulation_steps)
      return self._with_norms(logs, norms)
    record = gradients.StepRecord()
    logs = self._task.train_step(inputs, self._model,
                                 self._optimizers(record), self._metrics,
                                 **self._kwargs)
    return self._with_norms(logs, record.norms)

  def _optimizers(self, record: gradients.StepRecord
                  ) -> Dict[str, gradients.OptimizerWithOptions]:
    """What a `train_step` of several models gets: each optimizer with the
    options `trainer.minimize` applies with it and the step's `record`,
    where `minimize` reports (traced once: no cost per step)."""
    return {name: gradients.OptimizerWithOptions(
        each, self._model_options.get(name, gradients.StepOptions()),
        record) for name, each in self._optimizer.items()}

  @graph_code.written_for_graphs
  def _with_norms(self, logs, norms):
    """Adds each model's gradient norm (`trainer.minimize`'s) to a step's
    logs as `gradient_norm/<model>`, and makes the loss NaN where a norm is
    not finite and no loss scaling skips that step, as the default step
    does, so the guard stops at this step."""
    if not isinstance(logs, dict) or "loss" not in logs:
      return logs  # `train_step` reports the mistake.
    logs = dict(logs)
    finite = []
    for name, optimizer in named.named(self._optimizer).items():
      norm = norms.get(id(optimizer))
      if norm is None:
        continue
      logs.setdefault(f"gradient_norm/{name}", norm)
      if not isinstance(optimizer,
                        tf_keras.mixed_precision.LossScaleOptimizer):
        finite.append(tf.math.is_finite(norm))
    if finite:
      logs["loss"] = tf.where(tf.reduce_all(tf.stack(finite)), logs["loss"],
                              tf.constant(float("nan"), logs["loss"].dtype))
    return logs
