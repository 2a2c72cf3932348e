"""`TaskTrainer`: the Orbit trainer built from a `Task`, the inner train loop.

It owns `strategy.run`, the reduction across replicas, the global step and
what a loop reports to the controller; the Task owns the per-replica maths.
The loop calls rooms of one concern each: the per-replica step
(`replica_step`), the summary window's sums (`summary_window`), the first-step
loss-scaling check (`first_step_check`), the input position
(`input_position`), the tf.data service's new jobs (`job_retry`) and the
check that every optimizer stepped (`idle_optimizers`).
The evaluator is `trainer.loop.runner.evaluator.TaskEvaluator`; the
parameter-server trainer, which schedules steps on workers,
`trainer.loop.runner.scheduled_trainer.ScheduledTaskTrainer`.
"""

import contextlib
import dataclasses
import math
from typing import ContextManager, Dict, Optional, Tuple

import orbit
import tensorflow as tf
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.python.framework import config as framework_config
import tf_keras

from trainer import errors
from trainer import graph_code
from trainer.data import data_loss
from trainer.data import inputs as inputs_lib
from trainer.loop.runner import first_step_check
from trainer.loop.runner import idle_optimizers
from trainer.loop.runner import input_position
from trainer.loop.runner import job_retry
from trainer.loop.runner import replica_step
from trainer.loop.runner import source_shares
from trainer.loop.runner import summary_window
from trainer.model import gradients
from trainer.model import named
from trainer.model import optimization
from trainer.model import task as task_lib


@dataclasses.dataclass(frozen=True)
class LoopStatus:
  """What a training loop reports to the host.

  Attributes:
    loss: The mean loss of the loop's steps (not finite where a step's
      was); None where the runner has none (a plain Orbit runner whose
      output has no `loss`).
    nonfinite_step: The step whose loss was not finite (the loop stopped
      after it), or -1.
    learning_rate: The learning rate after the loop if it follows a
      schedule, else None.
    step: The global step after the loop, read with the rest; None where
      the runner does not report it (the controller then reads it).
  """
  loss: Optional[float]
  nonfinite_step: int
  learning_rate: Optional[float]
  step: Optional[int] = None


class TaskTrainer(orbit.StandardTrainer):
  """Runs a Task's `train_step` on every replica, `steps_per_loop` at a time.

  `train(n)` runs n steps inside one `tf.function` (a `tf.while_loop`) unless
  `run_eagerly`; `loop_status()` then reads what the loop reports (its mean
  loss, a non-finite step, a scheduled learning rate, the global step) in
  one device read.
  Task metrics and the window's sums keep accumulating across loops until
  `read_and_reset_metrics()`, so summaries cover every step since the last
  summary.
  """

  def __init__(self, task: task_lib.Task, model: tf_keras.Model,
               optimizer: tf_keras.optimizers.Optimizer,
               strategy: tf.distribute.Strategy,
               train_input: inputs_lib.DistributedInput,
               global_step: tf.Variable, *, run_eagerly: bool = False,
               enable_xla: bool = False,
               step_options: Optional[gradients.StepOptions] = None,
               model_options: Optional[Dict[str, gradients.StepOptions]] = None,
               check_loss_scaling: bool = False):
    """Builds the trainer.

    Args:
      task: Supplies `train_step` and the training metrics.
      model: The model, built in `strategy.scope()`.
      optimizer: The optimizer, built in `strategy.scope()`.
      strategy: Runs the replica steps.
      train_input: The training batches and their split over replicas.
      global_step: Incremented once per step.
      run_eagerly: Run steps without `tf.function`.
      enable_xla: Compile the per-replica step with XLA.
      step_options: Micro-batches and clipping for the default
        `Task.train_step`.
      model_options: With several models, each one's clipping by name, which
        `trainer.minimize` applies with its optimizer.
      check_loss_scaling: Check an overridden `train_step`'s loss scaling
        on the first step of a new run (`trainer.model.loss_scaling`).

    Raises:
      errors.ConfigError: If the task overrides `train_step` but the
        settings need the default one.
    """
    self.task = task
    self.model = model
    self.optimizer = optimizer
    self.strategy = strategy
    self.global_step = global_step
    self._input = train_input
    with strategy.scope():
      self.metrics = task.build_metrics(training=True)
    self._run_eagerly = run_eagerly
    self.in_loop = False  # Whether a `train` call is running.
    self._reported = None  # The status the last loop returned, if any.
    self._checked_optimizers = False
    self._create_loop_variables(check_loss_scaling)
    self._replica_step = replica_step.build(
        self.task, self.model, self.optimizer, self.metrics,
        step_options or gradients.StepOptions(),
        per_replica_batch_size=train_input.per_replica_batch_size,
        num_replicas=strategy.num_replicas_in_sync, enable_xla=enable_xla,
        model_options=model_options,
        # A mixture's summaries show each source's loss.
        per_example_loss=train_input.mixture is not None)
    super().__init__(self._train_dataset())

  def _create_loop_variables(self, check_loss_scaling: bool) -> None:
    """Creates what the loop adds to and reports through, and the rooms
    that own them."""
    self._window = summary_window.SummaryWindow(
        self.strategy, type(self.task).__name__, self._host_scope)
    # A mixture's examples and their losses per source, for the summaries.
    self._shares = (None if self._input.mixture is None else
                    source_shares.SourceShares(self._input.mixture,
                                               self._host_scope))
    # What the host reads after each loop, in one read: the loop's mean
    # loss, the step whose loss was not finite (-1: none; the loop stops
    # right after it), for a schedule the learning rate after the loop
    # (NaN for a constant rate: an eager schedule evaluation costs ~0.4 ms,
    # measured, so it is computed in the compiled loop) and the global step
    # after the loop (the controller checks the loop's count with it,
    # without a read of its own; float64 holds steps exactly to 2**53).
    self._status = tf.Variable([0.0, -1.0, float("nan"), 0.0],
                               dtype=tf.float64, trainable=False,
                               name="loop_status")
    self._position = input_position.InputPosition(self._input,
                                                  self._read_from)
    # Checkpointed, so the input can be skipped on resume, and a resume with
    # another batch size knows the checkpoint's.
    self.discarded_batches = self._position.discarded_batches
    self.input_batch_size = self._position.global_batch_size
    self._first_step = first_step_check.FirstStepCheck(
        self.task, self.model, self.optimizer, self.strategy, self._status,
        check_loss_scaling)
    self._scheduled = isinstance(
        optimization.get_learning_rate(named.first(self.optimizer)),
        tf_keras.optimizers.schedules.LearningRateSchedule)

  def _host_scope(self) -> ContextManager:
    """Where variables live that steps add to in cross-replica context:
    outside the strategy scope (they hold already-reduced values)."""
    return contextlib.nullcontext()

  def _train_dataset(self):
    """Returns what Orbit iterates, and sets `train_iterator`.

    The plain iterator (not a distributed one) can be checkpointed; Orbit
    calls `iter()` on what it is given, which returns the iterator itself.
    """
    with tf.device("/cpu:0"):
      self.train_iterator = iter(self._input.dataset)
    return self.train_iterator

  def train(self, num_steps: tf.Tensor):
    """Runs `num_steps` steps; see `orbit.StandardTrainer.train`.

    Raises:
      errors.ConfigError: If the input ends: it repeats forever, so it holds
        no complete batch at all. (Only here: a save failing for a file-size
        limit raises `OutOfRangeError` too, and is no input problem.)
      errors.RunError: If the tf.data service lost this run's job and a new
        one yields nothing, or an input file is damaged (naming it).
    """
    self.in_loop = True
    self._reported = None
    try:
      if self._first_step.pending:  # A context only where it may be due.
        with self._checking_loss_scaling():
          output = self._train(num_steps)
      else:
        output = self._train(num_steps)
      if not self._checked_optimizers:
        self._checked_optimizers = True
        idle_optimizers.check(type(self.task).__name__, self.optimizer)
      return output
    except tf.errors.OutOfRangeError as e:
      raise errors.ConfigError(
          "the training dataset yields no batch: it is empty, or smaller "
          "than one batch.") from e
    except tf.errors.InvalidArgumentError as e:
      mistake = task_lib.broadcast_error(e)
      if mistake is None:
        raise
      raise mistake from e
    except tf.errors.DataLossError as e:
      raise errors.RunError(data_loss.describe(e, self._input.dataset)) from e
    finally:
      self.in_loop = False

  def _train(self, num_steps: tf.Tensor):
    """Orbit's `train`, on new tf.data service jobs where they are lost."""
    if self._input.remote:
      return job_retry.train_on_new_jobs(
          super().train, num_steps, lambda: int(self.global_step.numpy()),
          lambda: self._read_from(self._input.build()))
    return super().train(num_steps)

  @property
  def train_input(self) -> inputs_lib.DistributedInput:
    """The training input this trainer reads."""
    return self._input

  @property
  def checks_loss_scaling(self) -> bool:
    """Whether the first loop will check an overridden `train_step`'s loss
    scaling (a new run of such a Task on several replicas)."""
    return self._first_step.pending

  @contextlib.contextmanager
  def _checking_loss_scaling(self):
    """Runs the loop inside with the loss-scaling check on its first step,
    on the first loop of a new run (`trainer.model.loss_scaling`), then checks.

    Raises:
      errors.ConfigError: If the step's loss is averaged per replica.
    """
    if not self._first_step.starts(self.global_step):
      yield
      return
    if self._train_loop_fn is None:
      self._train_loop_fn = self.create_train_loop_fn()
    loop_fn = self._train_loop_fn
    self._train_loop_fn = self._first_step.first_loop(self._loop_fn)
    try:
      yield
    finally:
      self._train_loop_fn = loop_fn
    self._first_step.check()

  def input_resumption(self, input_position: str, num_workers: int) -> str:
    """Returns "checkpoint" (checkpoint `train_iterator`), "workers" (each
    worker saves its own beside the checkpoint), "skip" (call `skip_input`
    with the restored step) or "restart": how a restarted run finds its
    place in the input (`input_position.InputPosition`)."""
    return self._position.resumption(input_position, num_workers)

  def skip_input(self, num_batches: int) -> int:
    """Restarts the input after its first `num_batches` batches and those
    discarded (`input_position.InputPosition.skip`); returns the number of
    batches skipped."""
    return self._position.skip(num_batches)

  def input_restored(self) -> None:
    """Call after every restore: saves from here on record this run's
    batch size (`input_position.InputPosition.restored`)."""
    self._position.restored()

  def rebase_input(self, step: int, batch_size: int,
                   new_batch_size: int) -> Tuple[int, int]:
    """Skips the examples that batches of `batch_size` took up to `step`,
    in batches of `new_batch_size` (`input_position.InputPosition.rebase`);
    returns the batches skipped and the examples trained on before."""
    return self._position.rebase(self.train_iterator, step, batch_size,
                                 new_batch_size)

  def discard_batch(self) -> None:
    """Reads the next training batch and throws it away."""
    self._position.discard(self.train_iterator)

  def _read_from(self, dataset: tf.data.Dataset) -> None:
    """Makes training read `dataset` from here on (Orbit iterates
    `train_dataset` anew when it is set)."""
    with tf.device("/cpu:0"):
      self.train_iterator = iter(dataset)
    self.train_dataset = self.train_iterator

  def create_train_loop_fn(self):
    """Returns `loop(iterator, num_steps)`, which also records the status.

    Orbit's loop discards step outputs, so a per-loop mean would need a
    metric reset and read in eager mode around every loop: about 1 ms per
    loop here, a fifth of a step at `steps_per_loop=1`. Summing inside the
    compiled loop keeps one `tf.function` call and one read per loop: the
    loop returns its status, which `loop_status` reads without an op of its
    own (it also goes to the `loop_status` variable, which the first-step
    check and the parameter-server loop write).

    The compiled loop is called through its concrete function for the
    iterator at hand: `tf.function`'s own call matches the arguments
    against its traces every time, about 800 Python calls a loop (1,400
    against 580, counted), a cost that only shows where loops are short.
    """

    def loop(iterator, num_steps, check_first_step=False):
      # The window's sums are read once, carried through the steps and
      # written back once (`summary_window`); the loop's own mean loss is
      # what its steps added to them.
      start = self._window.value()
      first_batch = None
      if check_first_step:  # One step, traced once: a new run's first.
        loss, sums, first_batch = self._step(iterator,
                                             check_loss_scaling=True)
        finite = tf.math.is_finite(loss)
        sums = start + sums
      else:
        # The guard's check is the loop's condition: the loop stops right
        # after the step whose loss was not finite, with no branch in its
        # body (a `break` costs a conditional and its loop variables at
        # every step).
        def body(index, unused_finite, sums):
          loss, step_sums = self._step(iterator)
          return index + 1, tf.math.is_finite(loss), sums + step_sums

        _, finite, sums = tf.while_loop(
            lambda index, finite, unused_sums: tf.logical_and(
                finite, index < num_steps), body,
            (tf.zeros([], getattr(num_steps, "dtype", tf.int32)),
             tf.constant(True), start))
      self._window.assign(sums)
      # With a non-finite step the mean is not finite either; the
      # controller rolls back or stops without it.
      loop_sums = sums - start
      status = tf.stack([
          loop_sums[0] / tf.maximum(loop_sums[1], 1.0),
          tf.where(finite, tf.constant(-1.0, tf.float64),
                   tf.cast(self.global_step.read_value(), tf.float64)),
          self._scheduled_rate(),
          tf.cast(self.global_step.read_value(), tf.float64)])
      self._status.assign(status)
      return first_batch if check_first_step else status

    self._compiled_loop = None if self._run_eagerly else tf.function(loop)
    self._loop_fn = self._compiled_loop or loop
    # (iterator, steps dtype, the concrete loop function for them).
    self._concrete_loop = None

    def run(iterator, num_steps):
      self._reported = self._call_loop(iterator, num_steps)

    return run

  def _call_loop(self, iterator, num_steps: tf.Tensor) -> tf.Tensor:
    """Calls the loop, through its concrete function once it is traced for
    `iterator` (not where functions are asked to run eagerly)."""
    # Nor from the tf.data service: after a lost job, loops called through
    # the concrete function lost the new job too, about 120 steps later
    # (measured: a second `lost this run's job` line in 5 of 6 runs; none in
    # 2 through `tf.function`'s own call). The remote input dominates a
    # loop's cost there anyway.
    if (self._compiled_loop is None or tf.config.functions_run_eagerly() or
        not isinstance(num_steps, tf.Tensor) or self._input.remote):
      return self._loop_fn(iterator, num_steps)
    cached = self._concrete_loop
    if (cached is None or cached[0] is not iterator or
        cached[1] != num_steps.dtype):
      # The first call traces (and creates what the step creates).
      status = self._compiled_loop(iterator, num_steps)
      self._concrete_loop = (iterator, num_steps.dtype,
                             self._compiled_loop.get_concrete_function(
                                 iterator, num_steps))
      return status
    return cached[2](iterator, num_steps, False)

  def traced_loop(self) -> Optional[tf.types.experimental.ConcreteFunction]:
    """Returns the traced training loop; None before the first loop and when
    running eagerly."""
    if getattr(self, "_compiled_loop", None) is None:
      return None
    return self._compiled_loop.get_concrete_function(
        self.train_iterator, tf.TensorSpec([], tf.int32))

  @graph_code.written_for_graphs
  def _scheduled_rate(self) -> tf.Tensor:
    """The learning rate now if it follows a schedule, else NaN."""
    if not self._scheduled:
      return tf.constant(float("nan"), tf.float64)
    return tf.cast(optimization.current_learning_rate(
        named.first(self.optimizer)), tf.float64)

  @graph_code.written_for_graphs
  def train_step(self, iterator) -> tf.Tensor:
    """Runs one step on every replica and adds it to the summary window;
    returns the global mean loss. (The compiled loop adds its steps to the
    window once per loop instead.)"""
    loss, step_sums = self._step(iterator)
    self._window.add_sums(step_sums)
    return loss

  @graph_code.written_for_graphs
  def _step(self, iterator, check_loss_scaling: bool = False):
    """One step on every replica; returns `(the global mean loss, what the
    step adds to the summary window's sums)`.

    `check_loss_scaling` also records the loss with its reference for the
    first-step check (`first_step_check.FirstStepCheck.record`), and returns
    the first replica's batch or None third.
    """
    batch, waited = self._next_batch(iterator)
    batch, sources = self._input.sources(batch)
    batch = self._input.split(batch)
    if check_loss_scaling:
      logs, reference = self.strategy.run(
          self._first_step.replica_step(self._replica_step), args=(batch,))
    else:
      logs = self.strategy.run(self._replica_step, args=(batch,))
    if not isinstance(logs, dict) or "loss" not in logs:
      raise errors.ConfigError(
          f"{type(self.task).__name__}.train_step must return a dict with "
          f"`loss`, got {type(logs).__name__}"
          f"{' ' + str(sorted(logs)) if isinstance(logs, dict) else ''}.")
    # Per-example losses go to the sources' sums only (with a mixture), not
    # to the window's scalars.
    logs = dict(logs)
    per_example_loss = logs.pop(gradients.PER_EXAMPLE_LOSS, None)
    if sources is not None:
      self._shares.add(sources, None if per_example_loss is None else
                       source_shares.worker_losses(
                           self.strategy, per_example_loss,
                           self._input.per_replica_batch_size,
                           type(self.task).__name__))
    loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, logs["loss"],
                                axis=None)
    first_batch = (self._first_step.record(loss, logs, batch, reference)
                   if check_loss_scaling else None)
    step_sums = self._window.step_sums(loss, logs, waited)
    # Counted once the step's batch has come and been trained on: nothing
    # else orders it after `next`, and the tf.data service's stall warning
    # reads the step while a loop runs (measured: it read 1 while the first
    # batch had not come).
    with tf.control_dependencies([step_sums]):
      self.global_step.assign_add(1)
    loss = tf.cast(loss, tf.float32)
    if check_loss_scaling:
      return loss, step_sums, first_batch
    return loss, step_sums

  @graph_code.written_for_graphs
  def _next_batch(self, iterator):
    """Returns the next batch and the seconds `next` waited for it (0 where
    steps do not time their wait)."""
    if not self._measures_input_wait():
      return next(iterator), tf.constant(0.0, tf.float64)
    # The time `next` blocks is the time the step waited for the input
    # pipeline (prefetched batches return at once). Ordered by automatic
    # control dependencies: timestamps and `next` are stateful.
    start = tf.timestamp()
    batch = next(iterator)
    with tf.control_dependencies(tf.nest.flatten(batch)):
      return batch, tf.timestamp() - start

  def loop_status(self) -> LoopStatus:
    """Reads what the last loop reported, in one device read.

    A loop returns no output of its own (`train` returns None): its loss
    and scheduled learning rate are read here, and the controller gives
    them to its train actions.
    """
    # The status the loop returned; the variable after a first-step check
    # or a parameter-server loop, which return none.
    reported = self._status if self._reported is None else self._reported
    loss, nonfinite_step, learning_rate, step = reported.numpy()
    return LoopStatus(float(loss), int(nonfinite_step),
                      None if math.isnan(learning_rate) else
                      float(learning_rate), int(step))

  def read_and_reset_metrics(self) -> Dict[str, float]:
    """Returns the window's mean loss, gradient norm (when the step reports
    one), seconds waited for input (`input_wait_seconds`) and task metrics,
    and the learning rate now; resets the window."""
    results, waited = self._window.read_and_reset()
    results.update({metric.name: metric.result() for metric in self.metrics})
    for metric in self.metrics:
      metric.reset_state()
    # The first optimizer's (or part's) rate, and each one's by name.
    results["learning_rate"] = float(
        optimization.current_learning_rate(named.first(self.optimizer)))
    several = named.named(self.optimizer) if named.several(
        self.optimizer) else optimization.parts(self.optimizer)
    for name, optimizer in several.items():
      results[f"learning_rate/{name}"] = float(
          optimization.current_learning_rate(optimizer))
    if self._measures_input_wait():
      results["input_wait_seconds"] = waited
    if self._shares is not None:
      results.update(self._shares.read_and_reset())
    return results

  @graph_code.written_for_graphs
  def _measures_input_wait(self) -> bool:
    """Whether steps time their wait for input.

    Not under op determinism, where TensorFlow refuses `tf.timestamp`.
    (The public API can enable determinism but not ask for it.)
    """
    return not framework_config.is_op_determinism_enabled()
