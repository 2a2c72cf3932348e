"""The pipelined forward and backward pass: GPipe on TensorFlow's executor.

`gradient_fn` stands in for `Task.compute_gradients` in the default
`Task.train_step` (`gradients.StepOptions.gradient_fn`), which then sums,
clips and applies the gradients once, as for any step. It cuts its batch
into M micro-batches and writes, in one traced step, every micro-batch's
pass through every stage (`trainer.distribute.pipeline.Stages`, each on its
device) and one backward pass over their summed loss. Nothing orders stage
k+1 on micro-batch i against stage k on micro-batch i+1, so TensorFlow's
executor runs them at once on their two devices: the pipeline is the
dataflow graph, as in Lingvo's `gpipe.py`, not a scheduler of ours.

The micro-batches are unrolled in Python rather than looped in a
`tf.while_loop` (as `gradients.accumulate` does): a loop's iterations run
one after another, which is the serialisation a pipeline removes. The graph
grows with M * K stage calls.

Every micro-batch's loss is its per-example losses summed and divided by
the step's GLOBAL batch, so their sum is the loss of the whole batch and the
update equals the unpipelined step's up to float summation order. Batch
norm normalises each micro-batch by its own statistics, as in GPipe.
"""

from typing import Any, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import graph_code
from trainer.distribute import pipeline
from trainer.distribute import placement
from trainer.model import gradients
from trainer.model import named
from trainer.model import task as task_lib


def gradient_fn(task: task_lib.Task, stages: pipeline.Stages,
                config: pipeline.PipelineConfig, *,
                micro_batch_examples: int) -> gradients.GradientFn:
  """Returns the pipelined `(inputs, model, optimizer) -> (loss, gradients,
  outputs)` for `task`'s model cut into `stages`.

  Args:
    task: Supplies `build_losses`; its `train_step` must be the default.
    stages: The model's stages.
    config: The micro-batch count and recomputation.
    micro_batch_examples: Examples each call gets: the per-replica batch
      divided by `trainer.gradient_accumulation_steps`.

  Raises:
    errors.ConfigError: If the task overrides `train_step`, or the
      micro-batches do not divide the batch.
  """
  if task_lib.overrides(task, "train_step"):
    raise errors.ConfigError(
        f"{type(task).__name__} overrides `Task.train_step`; a pipeline "
        "(`pipeline.boundaries`/`task_stages`) runs in the default one.")
  if micro_batch_examples % config.num_microbatches:
    raise errors.ConfigError(
        f"`pipeline.num_microbatches` ({config.num_microbatches}) does not "
        f"divide the {micro_batch_examples} example(s) of each step "
        "(`trainer.global_batch_size` per replica and accumulation step) "
        "into equal micro-batches.")
  return _PipelinedGradients(task, stages, config)


class _PipelinedGradients:
  """The pipelined `compute_gradients`; see `gradient_fn`."""

  def __init__(self, task: task_lib.Task, stages: pipeline.Stages,
               config: pipeline.PipelineConfig):
    self._task = task
    self._num_microbatches = config.num_microbatches
    self._stage_fns = [stages.function(i) for i in range(len(stages))]
    if config.recompute:
      self._stage_fns = [tf.recompute_grad(f) for f in self._stage_fns]

  @graph_code.written_for_graphs
  def __call__(self, inputs, model: tf_keras.Model, optimizer
               ) -> Tuple[tf.Tensor, List[Optional[tf.Tensor]], Any]:
    if named.several(model):  # `trainer.state` refuses it; a safeguard.
      raise errors.ConfigError("a pipeline trains one model.")
    features, labels = inputs
    num = self._num_microbatches
    build_losses = graph_code.user_code(self._task.build_losses)
    scaled = isinstance(optimizer,
                        tf_keras.mixed_precision.LossScaleOptimizer)
    with tf.GradientTape() as tape:
      losses, outputs = [], []
      for index in range(num):
        activations = gradients.micro_batch(features, index, num)
        for stage_fn in self._stage_fns:
          activations = stage_fn(activations)
        micro_outputs = task_lib.float32_outputs(activations)
        per_example = build_losses(gradients.micro_batch(labels, index, num),
                                   micro_outputs)
        # The micro-batch's share of the global mean: compute_average_loss
        # divides by the micro-batch's global size, num times the batch's.
        losses.append(tf.nn.compute_average_loss(per_example) / num)
        outputs.append(micro_outputs)
      loss = tf.add_n(losses)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      tape_loss = optimizer.get_scaled_loss(loss) if scaled else loss
    # `tf.gradients` in a traced step: each gradient op beside its forward
    # op, so every stage's backward pass runs on its device.
    grads = placement.gradients(tape, tape_loss, model.trainable_variables)
    if scaled:
      grads = optimizer.get_unscaled_gradients(grads)
    return loss, grads, tf.nest.map_structure(
        lambda *parts: tf.concat(parts, axis=0), *outputs)
