"""The default training step's gradient path, one replica at a time.

`Task.train_step` runs `accumulate` (the forward and backward pass over
`accumulation_steps` micro-batches of the replica's slice), then
`clip_and_apply`: `sum_over_replicas` (one all-reduce), `clip`, and
`apply_gradients` with `experimental_aggregate_gradients=False`. Summing here
rather than inside `apply_gradients` costs the same single all-reduce and
lets the global norm and the clipping see the gradient of the whole global
batch, identical on every replica, whatever the replica count.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import graph_code

# (inputs, model, optimizer) -> (loss, gradients, model outputs).
GradientFn = Callable[..., Tuple[tf.Tensor, List[Optional[tf.Tensor]], Any]]

# The key of a step's per-example losses in its logs (shape [the replica's
# batch], in the order of its examples): the default `Task.train_step`
# returns them where the framework asks (`StepOptions.report_per_example_
# loss`), an own `train_step` may return them; a mixture's summaries show
# each source's mean of them (`trainer.loop.runner.source_shares`).
PER_EXAMPLE_LOSS = "per_example_loss"


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How the default `Task.train_step` turns a batch into an update.

  Attributes:
    accumulation_steps: Micro-batches per step; the replica's slice of the
      global batch is cut into this many, one forward and backward pass each.
    clip_norm: Clip the summed gradients to this global norm; None for no
      clipping.
    clip_value: Clip every summed gradient element to [-v, v]; None for no
      clipping.
    gradient_fn: Stands in for `Task.compute_gradients` (the framework passes
      an XLA-compiled one under `runtime.enable_xla` on several replicas).
    report_per_example_loss: Also return `build_losses`' per-example losses
      under `PER_EXAMPLE_LOSS` (the framework asks for them where a
      training mixture summarises each source's loss; they cost a second
      evaluation of `build_losses` on the outputs, so only then).
  """
  accumulation_steps: int = 1
  clip_norm: Optional[float] = None
  clip_value: Optional[float] = None
  gradient_fn: Optional[GradientFn] = None
  report_per_example_loss: bool = False

  @classmethod
  def from_config(cls, config) -> "StepOptions":
    """Returns the options a `trainer.TrainerConfig` sets."""
    return cls(accumulation_steps=config.gradient_accumulation_steps,
               clip_norm=config.gradient_clip_norm,
               clip_value=config.gradient_clip_value)


@graph_code.written_for_graphs
def micro_batch(inputs, index, num_micro_batches: int):
  """Returns micro-batch `index` of `num_micro_batches` equal parts."""
  if num_micro_batches == 1:
    return inputs

  def part(tensor):
    size = tf.shape(tensor)[0] // num_micro_batches
    return tensor[index * size:(index + 1) * size]

  return tf.nest.map_structure(part, inputs)


@graph_code.written_for_graphs
def accumulate(gradient_fn: GradientFn, inputs, model, optimizer,
               num_micro_batches: int,
               on_outputs: Callable[[Any, Any], Optional[tf.Tensor]]
               ) -> Tuple[tf.Tensor, List[Optional[tf.Tensor]],
                          Optional[tf.Tensor]]:
  """Runs `gradient_fn` on each micro-batch; sums losses and gradients.

  Each micro-batch's loss is its share of the global mean over the
  micro-batch's global size; dividing the sums by `num_micro_batches` makes
  them shares of the mean over the whole global batch, so K micro-batches of
  B examples give the update of one batch of K * B.

  Args:
    gradient_fn: `(inputs, model, optimizer) -> (loss, gradients, outputs)`.
    inputs: This replica's slice of the global batch.
    model: The model.
    optimizer: Passed to `gradient_fn` (for loss scaling).
    num_micro_batches: How many parts to cut `inputs` into.
    on_outputs: Called with each micro-batch and its model outputs (metrics);
      returns None, or a value per example of the micro-batch (its leading
      axis), which is gathered over the micro-batches.

  Returns:
    `(loss, gradients, gathered)`: gradients None for variables the loss
    ignores; `gathered`, what `on_outputs` returned for every micro-batch,
    concatenated in the order of `inputs`' examples (None where it returns
    None).
  """
  # Possibly the user's: converted by autograph (`graph_code`).
  gradient_fn = graph_code.user_code(gradient_fn)
  on_outputs = graph_code.user_code(on_outputs)
  first = micro_batch(inputs, 0, num_micro_batches)
  loss, grads, outputs = gradient_fn(first, model, optimizer)
  values = on_outputs(first, outputs)
  if num_micro_batches == 1:
    return loss, list(grads), values
  used = [i for i, g in enumerate(grads) if g is not None]
  # A while-loop keeps one copy of the forward and backward pass in the
  # graph whatever the number of micro-batches; it carries dense tensors.
  carried = [tf.convert_to_tensor(grads[i]) for i in used]
  gathered = _gathering(values, num_micro_batches)

  def body(index, loss_sum, grad_sums, gathered):
    batch = micro_batch(inputs, index, num_micro_batches)
    loss, grads, outputs = gradient_fn(batch, model, optimizer)
    values = on_outputs(batch, outputs)
    return (index + 1, loss_sum + loss,
            [total + tf.convert_to_tensor(grads[i])
             for total, i in zip(grad_sums, used)],
            [array.write(index, values) for array in gathered])

  _, loss, carried, gathered = tf.while_loop(
      lambda index, *_: index < num_micro_batches, body,
      (tf.constant(1), loss, carried, gathered))
  scale = 1.0 / num_micro_batches
  return loss * scale, _in_place_of_present(
      grads, [total * tf.cast(scale, total.dtype) for total in carried]), (
          gathered[0].concat() if gathered else None)


def _gathering(values: Optional[tf.Tensor],
               num_micro_batches: int) -> List[tf.TensorArray]:
  """Where a while-loop over micro-batches gathers a value per example: a
  `TensorArray` holding micro-batch 0's `values` (none where None)."""
  if values is None:
    return []
  values = tf.convert_to_tensor(values)
  return [tf.TensorArray(values.dtype, size=num_micro_batches,
                         element_shape=values.shape).write(0, values)]


@graph_code.written_for_graphs
def per_example(losses: tf.Tensor) -> tf.Tensor:
  """Returns `build_losses`' losses as one per example, shape `[batch]`:
  summed over any further axes, as `tf.nn.compute_average_loss` sums them
  (so their mean over the global batch is the step's loss, less the
  regularisation losses)."""
  losses = tf.convert_to_tensor(losses)
  if losses.shape.rank is not None and losses.shape.rank > 1:
    losses = tf.reduce_sum(losses, axis=list(range(1, losses.shape.rank)))
  return losses


@graph_code.written_for_graphs
def sum_over_replicas(grads: List[Optional[tf.Tensor]]
                      ) -> List[Optional[tf.Tensor]]:
  """Sums each gradient over the replicas in sync (in replica context)."""
  if tf.distribute.get_strategy().num_replicas_in_sync == 1:
    return grads
  present = [g for g in grads if g is not None]
  summed = tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, present)
  return _in_place_of_present(grads, summed)


def _in_place_of_present(grads: List[Optional[tf.Tensor]],
                         values: List[tf.Tensor]
                         ) -> List[Optional[tf.Tensor]]:
  """Returns `grads` with its non-None entries replaced, in order, by
  `values`; None stays None (a variable the loss does not reach)."""
  values = iter(values)
  return [None if g is None else next(values) for g in grads]


@graph_code.written_for_graphs
def _optimizer_must_aggregate() -> bool:
  """Whether the optimizer must sum the gradients itself.

  tf_keras' legacy optimizers refuse gradients summed beforehand under
  these strategies (`experimental_aggregate_gradients=False` raises).
  """
  return isinstance(tf.distribute.get_strategy(), (
      tf.distribute.experimental.ParameterServerStrategy,
      tf.distribute.experimental.CentralStorageStrategy,
      tf.compat.v1.distribute.experimental.ParameterServerStrategy,
      tf.compat.v1.distribute.experimental.CentralStorageStrategy))


@graph_code.written_for_graphs
def clip_and_apply(optimizer, grads: List[Optional[tf.Tensor]], variables,
                   options: StepOptions) -> tf.Tensor:
  """Sums `grads` over replicas, clips them and applies them.

  Where the optimizer must sum the gradients itself (parameter servers,
  central storage), the summed gradients only give the norm; the clipping
  factor is applied to each replica's gradients, which is the same for the
  global norm (a common factor), and per replica for `clip_value`.

  Returns:
    The global norm of the summed gradients before clipping.
  """
  if _optimizer_must_aggregate():
    norm = global_norm(sum_over_replicas(grads))
    optimizer.apply_gradients(zip(clip(grads, norm, options), variables))
    return norm
  grads = sum_over_replicas(grads)
  norm = global_norm(grads)
  optimizer.apply_gradients(zip(clip(grads, norm, options), variables),
                            experimental_aggregate_gradients=False)
  return norm


@graph_code.written_for_graphs
def global_norm(grads: List[Optional[tf.Tensor]]) -> tf.Tensor:
  """Returns the float32 global norm of the gradients that exist."""
  present = [tf.cast(g, tf.float32) for g in grads if g is not None]
  return tf.linalg.global_norm(present) if present else tf.constant(0.0)


@graph_code.written_for_graphs
def clip(grads: List[Optional[tf.Tensor]], norm: tf.Tensor,
         options: StepOptions) -> List[Optional[tf.Tensor]]:
  """Clips by global norm (given, computed before) and then by value."""
  if options.clip_norm is not None:
    # As `tf.clip_by_global_norm`, with the norm already at hand: a
    # non-finite norm makes every gradient NaN, so the step is still seen as
    # non-finite (by the guard, or by dynamic loss scaling, which skips it).
    factor = tf.where(tf.math.is_finite(norm),
                      options.clip_norm / tf.maximum(norm, options.clip_norm),
                      float("nan"))
    grads = [None if g is None else g * tf.cast(factor, g.dtype)
             for g in grads]
  if options.clip_value is not None:
    grads = [None if g is None else
             tf.clip_by_value(g, -options.clip_value, options.clip_value)
             for g in grads]
  return grads


@dataclasses.dataclass
class StepRecord:
  """Where a step's `minimize` calls report, given with each optimizer.

  Attributes:
    norms: By `id(optimizer)`, the global norm of the gradients `minimize`
      applied (the framework summarises each model's).
    updates: The updates `minimize` keeps instead of applying, in call
      order (micro-batches: `accumulate_updates`); None: it applies them.
  """
  norms: Dict[int, tf.Tensor] = dataclasses.field(default_factory=dict)
  updates: Optional[List["Update"]] = None


class OptimizerWithOptions:
  """One model's optimizer with the options `minimize` applies with it.

  What a `train_step` of several models gets for each (`optimizer[name]`):
  the clipping gin binds for the model (`discriminator/trainer.gradient_clip_
  norm`) and where the step's `minimize` calls report (`StepRecord`) travel
  with the optimizer into `minimize`, as arguments, not in a table or a
  thread-local kept beside it. Any other attribute is the optimizer's own
  (`optimizer["generator"].iterations`); `optimizer` is the optimizer itself.
  """

  def __init__(self, optimizer, options: StepOptions,
               record: Optional[StepRecord] = None):
    self.optimizer = optimizer
    self.options = options
    self.record = record

  def __getattr__(self, name: str):
    # Only for what the instance lacks: `optimizer` and `options` are its own.
    return getattr(self.optimizer, name)


def minimize(tape: tf.GradientTape, loss: tf.Tensor, variables,
             optimizer, options: Optional[StepOptions] = None) -> tf.Tensor:
  """One optimizer's update in a `train_step` that trains several models.

  Takes the gradient of `loss` (this replica's share of the global-batch
  mean, as `tf.nn.compute_average_loss` gives) recorded on `tape` with
  respect to `variables`, scaled and unscaled for a float16 loss-scale
  optimizer, sums it over replicas, clips it (`options`; by default those
  the framework gives with the optimizer, an `OptimizerWithOptions`: what gin
  binds for its model, `trainer.gradient_clip_norm` / `_value`, or under the
  model's name, `generator/trainer.gradient_clip_norm`; none for a plain
  optimizer) and applies it. Use a persistent tape when several losses come
  from one forward pass. Pass the optimizer `train_step` was given
  (`optimizer["generator"]`): it also carries where the step's norms and,
  under micro-batches, its updates go.

  Under `trainer.gradient_accumulation_steps` (K > 1) the framework runs the
  `train_step` once per micro-batch, and `minimize` only keeps the gradient:
  each optimizer applies the sum of its K gradients once, after the last
  micro-batch (`accumulate_updates`).

  Returns:
    The global norm of the summed gradients before clipping (not finite
    where a gradient is not); under accumulation, of this micro-batch's
    gradient on this replica (the framework reports the applied one's).
  """
  variables = list(variables)
  record = None
  if isinstance(optimizer, OptimizerWithOptions):
    options = options or optimizer.options
    record = optimizer.record
    optimizer = optimizer.optimizer
  options = options or StepOptions()
  scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
  target = loss
  if scaled:
    with tape:  # Recorded, so the scaling is part of the gradient.
      target = optimizer.get_scaled_loss(loss)
  grads = tape.gradient(target, variables)
  if scaled:
    grads = optimizer.get_unscaled_gradients(grads)
  if record is not None and record.updates is not None:
    record.updates.append(Update(optimizer, variables, list(grads), options))
    return global_norm(grads)
  norm = clip_and_apply(optimizer, grads, variables, options)
  if record is not None:
    record.norms[id(optimizer)] = norm
  return norm


@dataclasses.dataclass
class Update:
  """One `minimize` call's update, kept until the micro-batches are done."""
  optimizer: Any
  variables: List[tf.Variable]
  grads: List[Optional[tf.Tensor]]
  options: StepOptions


# A Task's `train_step` on a micro-batch, with its optimizers reporting to a
# record: `step(inputs, record) -> logs`.
RecordedStep = Callable[[Any, StepRecord], Any]


def accumulate_updates(step: RecordedStep, inputs,
                       num_micro_batches: int) -> Tuple[Any, Dict[int, Any]]:
  """Runs `step` on each micro-batch of `inputs`; applies each optimizer's
  summed gradients once.

  `step` is a Task's `train_step` calling `minimize` (several models), with
  optimizers that report to the record it is given (`OptimizerWithOptions`,
  whose updates are kept there instead of applied). It
  runs on micro-batch 0 and then in a `tf.while_loop` on the others, every
  model at the weights of the step's start, so an update `step` computes
  after another (a generator's loss through the discriminator it just
  updated) sees the weights before it: the models update together. Each
  optimizer's gradients are summed, divided by `num_micro_batches` (each
  micro-batch's loss is its share of its own global mean), summed over
  replicas, clipped with its options and applied: K micro-batches of B
  examples give the update of one batch of K * B.

  Returns:
    `(logs, norms)`: the step's logs, floating-point ones averaged over the
    micro-batches (`PER_EXAMPLE_LOSS` gathered in the examples' order),
    others the first micro-batch's; and by
    `id(optimizer)` the global norm of its applied gradient before clipping.

  Raises:
    errors.ConfigError: If `step` calls `minimize` differently on two
      micro-batches.
  """
  updates = []
  logs = step(micro_batch(inputs, 0, num_micro_batches),
              StepRecord(updates=updates))
  logs, sums = _add_micro_batches(step, inputs, num_micro_batches, logs,
                                  updates)
  return logs, _apply_averaged(updates, sums, num_micro_batches)


def _add_micro_batches(step: RecordedStep, inputs,
                       num_micro_batches: int, logs, updates: List[Update]
                       ) -> Tuple[Any, List[List[tf.Tensor]]]:
  """Adds micro-batches 1 to `num_micro_batches - 1` to micro-batch 0's
  `logs` and `updates`, in a `tf.while_loop`.

  Returns:
    `(logs, sums)`: the logs, floating-point ones averaged
    (`PER_EXAMPLE_LOSS` gathered); and per update,
    the sums of its gradients that are not None, in order.

  Raises:
    errors.ConfigError: If `step` calls `minimize` differently on another
      micro-batch.
  """
  averaged = sorted(
      name for name, value in (logs.items() if isinstance(logs, dict) else ())
      if tf.is_tensor(value) and value.dtype.is_floating and
      name != PER_EXAMPLE_LOSS)
  used = [[i for i, g in enumerate(update.grads) if g is not None]
          for update in updates]
  # A while-loop keeps one copy of the step in the graph whatever the number
  # of micro-batches; it carries dense tensors.
  carried = [[tf.convert_to_tensor(update.grads[i]) for i in indices]
             for update, indices in zip(updates, used)]
  # Per-example losses are gathered in the examples' order, not averaged.
  gathered = _gathering(
      logs.get(PER_EXAMPLE_LOSS) if isinstance(logs, dict) else None,
      num_micro_batches)

  def body(index, log_sums, grad_sums, gathered):
    again = []
    step_logs = step(micro_batch(inputs, index, num_micro_batches),
                     StepRecord(updates=again))
    if [id(u.optimizer) for u in again] != [id(u.optimizer)
                                            for u in updates]:
      raise errors.ConfigError(
          "train_step called `trainer.minimize` with other optimizers on "
          "another micro-batch (`trainer.gradient_accumulation_steps`): "
          "call it the same way on every batch.")
    return (index + 1,
            [total + step_logs[name] for total, name in zip(log_sums,
                                                            averaged)],
            [[total + tf.convert_to_tensor(update.grads[i])
              for total, i in zip(sums, indices)]
             for sums, update, indices in zip(grad_sums, again, used)],
            [array.write(index, step_logs[PER_EXAMPLE_LOSS])
             for array in gathered])

  if num_micro_batches > 1:
    _, log_sums, carried, gathered = tf.while_loop(
        lambda index, *_: index < num_micro_batches, body,
        (tf.constant(1), [logs[name] for name in averaged], carried,
         gathered))
    logs = dict(logs, **{name: total / num_micro_batches
                         for name, total in zip(averaged, log_sums)})
    if gathered:
      logs[PER_EXAMPLE_LOSS] = gathered[0].concat()
  return logs, carried


def _apply_averaged(updates: List[Update], sums: List[List[tf.Tensor]],
                    num_micro_batches: int) -> Dict[int, Any]:
  """Applies each update's gradient sums divided by `num_micro_batches`,
  clipped with its options; returns by `id(optimizer)` the global norm of
  the applied gradient before clipping."""
  scale = 1.0 / num_micro_batches
  norms = {}
  for update, update_sums in zip(updates, sums):
    grads = _in_place_of_present(
        update.grads,
        [total * tf.cast(scale, total.dtype) for total in update_sums])
    norms[id(update.optimizer)] = clip_and_apply(
        update.optimizer, grads, update.variables, update.options)
  return norms
