"""`TaskTrainer`: the Orbit trainer built from a `Task`, the inner train loop.

It owns `strategy.run`, the reduction across replicas, the global step and
what a loop reports to the controller; the Task owns the per-replica maths.
The evaluator is `trainer.loop.evaluator.TaskEvaluator`; the parameter-server
trainer, which schedules steps on workers, `trainer.parameter_server`.
"""

import contextlib
import dataclasses
import math
from typing import ContextManager, Dict, List, Optional

import orbit
import tensorflow as tf
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.python.framework import config as framework_config
import tf_keras

from trainer import console
from trainer import errors
from trainer import graph_code
from trainer.data import data_loss
from trainer.data import inputs as inputs_lib
from trainer.data import service as data_service
from trainer.model import gradients
from trainer.model import loss_scaling
from trainer.model import named
from trainer.model import optimization
from trainer.model import task as task_lib


@dataclasses.dataclass(frozen=True)
class LoopStatus:
  """What a training loop reports to the host.

  Attributes:
    loss: The mean loss of the loop's steps.
    nonfinite_step: The step whose loss was not finite (the loop stopped
      after it), or -1.
    learning_rate: The learning rate after the loop if it follows a
      schedule, else None.
    step: The global step after the loop, read with the rest; None where
      the runner does not report it (the controller then reads it).
  """
  loss: float
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
      check_loss_scaling: Check an overridden `train_step`'s loss scaling
        on the first step of a new run (`trainer.loss_scaling`).

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
    self._checked_optimizers = False
    # Checked on the first loop of a new run only.
    self._checks_loss_scaling = check_loss_scaling and loss_scaling.applies(
        task, model, strategy.num_replicas_in_sync)
    self._create_loop_variables()
    self._configure_step(step_options or gradients.StepOptions(), enable_xla)
    super().__init__(self._train_dataset())

  def _create_loop_variables(self) -> None:
    """Creates what the loop adds to and reports through."""
    # Per-step sums over the summary window, in one variable so a step adds
    # to it with one op: loss, steps, gradient norm, steps with a finite
    # norm, seconds waited for input.
    with self._host_scope():
      self._window = tf.Variable(tf.zeros([5], tf.float64), trainable=False,
                                 name="window_sums")
    # Set when the step is first traced: whether it returns a gradient
    # norm, and the other scalars it returns (with their window sums).
    self._reports_norm = False
    self._extras: Optional[tf.Variable] = None
    self._extra_names: List[str] = []
    self._dropped = set()  # Non-scalar names, warned about once.
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
    # Batches thrown away (after a non-finite loss); checkpointed, so the
    # input can be skipped to `global_step + discarded_batches` on resume.
    self.discarded_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="discarded_batches")
    # Where the loss scaling is checked, the first step's loss and: for one
    # model, the sum and count of `build_losses` on its batch; for several,
    # the first replica's loss and 0.
    self._loss_check = tf.Variable(tf.zeros([3], tf.float64),
                                   trainable=False, name="loss_check")
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

  def _configure_step(self, options: gradients.StepOptions,
                      enable_xla: bool) -> None:
    """Sets the per-replica step and what it passes to `Task.train_step`.

    Raises:
      errors.ConfigError: If micro-batches do not divide the per-replica
        batch, or the task overrides `train_step` but the settings need the
        default one.
    """
    self._replica_step = self._task_train_step
    if enable_xla and self.strategy.num_replicas_in_sync == 1:
      self._replica_step = tf.function(self._task_train_step, jit_compile=True)
    elif enable_xla:
      # A whole step cannot be compiled on several replicas: summing the
      # gradients synchronises them. The forward and backward pass can.
      options = dataclasses.replace(
          options, gradient_fn=tf.function(self.task.compute_gradients,
                                           jit_compile=True))
    per_replica = self._input.per_replica_batch_size
    if per_replica % options.accumulation_steps:
      raise errors.ConfigError(
          f"`trainer.global_batch_size` gives {per_replica} example(s) per "
          "replica, which do not split into `trainer.gradient_accumulation_"
          f"steps` ({options.accumulation_steps}) equal micro-batches.")
    # Only the default `train_step` takes `options`; others get nothing.
    self._step_kwargs = {}
    # With several models the framework cuts the micro-batches itself.
    self._accumulation_steps = options.accumulation_steps
    if named.several(self.model) and not task_lib.overrides(self.task,
                                                            "train_step"):
      raise errors.ConfigError(
          f"{type(self.task).__name__} builds several models "
          f"({', '.join(self.model)}): it must override `train_step`, which "
          "gets them and their optimizers by name.")
    if not task_lib.overrides(self.task, "train_step"):
      self._step_kwargs["options"] = options
    elif named.several(self.model):
      # Clipping applies in `trainer.minimize`, per model (`trainer.state`);
      # micro-batches in `_task_train_step`.
      if options.gradient_fn is not None:
        raise errors.ConfigError(
            "`runtime.enable_xla` on several replicas compiles the default "
            "train_step's gradient pass; a Task with several models runs "
            "its own step: use one replica, or no XLA.")
    elif options != gradients.StepOptions():
      raise errors.ConfigError(
          f"{type(self.task).__name__} overrides `Task.train_step`, which "
          "then does its own gradient handling: `trainer.gradient_"
          "accumulation_steps`, `trainer.gradient_clip_norm`/`_value` and "
          "`runtime.enable_xla` on several replicas need the default step.")

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
    try:
      with self._checking_loss_scaling():
        output = (self._train_on_new_jobs(num_steps) if self._input.remote
                  else super().train(num_steps))
      if not self._checked_optimizers:
        self._checked_optimizers = True
        self._check_every_optimizer_stepped()
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

  @property
  def checks_loss_scaling(self) -> bool:
    """Whether the first loop will check an overridden `train_step`'s loss
    scaling (a new run of such a Task on several replicas)."""
    return self._checks_loss_scaling

  @contextlib.contextmanager
  def _checking_loss_scaling(self):
    """Runs the loop inside with the loss-scaling check on its first step,
    on the first loop of a new run (`trainer.loss_scaling`), then checks.

    Raises:
      errors.ConfigError: If the step's loss is averaged per replica.
    """
    if not self._checks_loss_scaling:
      yield
      return
    self._checks_loss_scaling = False
    if int(self.global_step.numpy()):
      yield  # Resumed: checked when the run was new.
      return
    if self._train_loop_fn is None:
      self._train_loop_fn = self.create_train_loop_fn()
    loop_fn = self._train_loop_fn
    several = named.several(self.model)
    # Several models: their copies, made before the step updates them.
    one_device = (loss_scaling.OneDeviceStep(self.task, self.model,
                                             self.optimizer)
                  if several else None)
    first_batch = []  # Several models: the first replica's batch.

    def first_loop(iterator, num_steps):
      # The checked step alone, then the loop's other steps: the step is
      # traced twice, not three times (measured on a ResNet-18).
      first_batch.append(loop_fn(iterator, num_steps, check_first_step=True))
      first_loss, nonfinite_step, _, _ = self._status.numpy()
      rest = int(num_steps) - 1
      if nonfinite_step >= 0 or rest <= 0:
        return
      loop_fn(iterator, tf.constant(rest, tf.int32))
      mean_loss, nonfinite_step, rate, step = self._status.numpy()
      self._status.assign([(first_loss + rest * mean_loss) / (rest + 1),
                           nonfinite_step, rate, step])

    self._train_loop_fn = first_loop
    try:
      yield
    finally:
      self._train_loop_fn = loop_fn
    loss, total, count = self._loss_check.numpy()
    if several:
      loss_scaling.check_several(
          type(self.task).__name__, self.strategy.num_replicas_in_sync, total,
          one_device.loss(first_batch[0]))
      return
    loss_scaling.check(type(self.task).__name__,
                       self.strategy.num_replicas_in_sync, loss, total,
                       count)

  def _train_on_new_jobs(self, num_steps: tf.Tensor):
    """Trains `num_steps` steps on the tf.data service's batches, reading
    from a new job where the service lost this run's.

    A dispatcher restarted without a journal forgets every dataset and job:
    the iterator fails with `NotFoundError`, after the steps the loop had
    trained. The pipeline built again registers anew and reads a new job,
    from its first batch (as a resumed run does). The first new job may
    fail too (measured: its ids are the restarted dispatcher's first, which
    the workers still hold for the lost job's tasks), so up to
    `data_service.NEW_JOBS` new jobs in a row are tried.

    Raises:
      errors.RunError: If none of them yields a batch.
    """
    remaining = int(num_steps)
    failures = 0  # The job lost, then new jobs that yielded no batch.
    while True:
      start = int(self.global_step.numpy())
      try:
        return super().train(num_steps)
      except tf.errors.NotFoundError as e:
        trained = int(self.global_step.numpy()) - start
        remaining -= trained
        num_steps = tf.constant(remaining, tf.int32)
        if trained:
          failures = 0
        if not failures:
          console.warning(data_service.new_job_line(start + trained))
        failures += 1
        if failures > data_service.NEW_JOBS:
          raise data_service.lost_job(e, data_service.NEW_JOBS) from e
        # A new pipeline: the old one names a dataset id the restarted
        # dispatcher does not know ("Dataset id 1000 not found", measured).
        self._read_from(self._input.build())

  def _check_every_optimizer_stepped(self) -> None:
    """After the first loop of a Task with several models: each optimizer
    has applied gradients (a `train_step` that forgets one trains a model
    that never changes, silently).

    Raises:
      errors.ConfigError: Naming the optimizers that took no step.
    """
    if not named.several(self.optimizer):
      return
    idle = [name for name, optimizer in sorted(
        named.named(self.optimizer).items())
            if int(optimization.unwrap(optimizer).iterations.numpy()) == 0]
    if idle:
      raise errors.ConfigError(
          f"{type(self.task).__name__}.train_step applied no gradients with "
          f"the optimizer of {', '.join(repr(n) for n in idle)}: call "
          "`trainer.minimize(tape, loss, model.trainable_variables, "
          "optimizer[name])` for each trained model, or freeze the model "
          "(`model.trainable = False`), which then gets no optimizer.")

  def input_resumption(self, input_position: str, num_workers: int) -> str:
    """Returns how a restarted run finds its place in the input.

    Args:
      input_position: `trainer.input_position`.
      num_workers: Workers reading the input; with several, the chief's
        checkpoint cannot hold every worker's iterator.

    Returns:
      "checkpoint" (checkpoint `train_iterator`), "skip" (call
      `skip_input` with the restored step) or "restart".
    """
    if input_position != "checkpoint":
      return input_position
    if self._input.remote:
      # The service's batches come in no reproducible order: skipping would
      # read and drop as many through it without finding the saved place.
      return "restart"
    if num_workers == 1 and self._input.checkpointable():
      return "checkpoint"
    # Some pipelines cannot be saved at all: skip what was consumed instead.
    return "skip"

  def skip_input(self, num_batches: int) -> int:
    """Restarts the input after its first `num_batches` batches.

    Resumes the input position when the iterator is not in the checkpoint:
    each worker reads one batch per step, so skipping `global_step` batches of
    a deterministic pipeline (plus those discarded after a non-finite loss)
    puts it where the saved run was. The skipped batches are read and
    thrown away, so the cost grows with the step.

    Returns:
      The number of batches skipped.
    """
    num_batches += int(self.discarded_batches.numpy())
    if num_batches <= 0:
      return 0
    # A new dataset, not `self._input.dataset`: iterating a dataset again
    # advances the seed of `shuffle(reshuffle_each_iteration=True)`, which
    # would give another order than the saved run's (measured).
    self._read_from(self._input.build().skip(num_batches))
    return num_batches

  def _read_from(self, dataset: tf.data.Dataset) -> None:
    """Makes training read `dataset` from here on (Orbit iterates
    `train_dataset` anew when it is set)."""
    with tf.device("/cpu:0"):
      self.train_iterator = iter(dataset)
    self.train_dataset = self.train_iterator

  def _task_train_step(self, inputs):
    if not named.several(self.optimizer):
      return self.task.train_step(inputs, self.model, self.optimizer,
                                  self.metrics, **self._step_kwargs)
    if self._accumulation_steps > 1:
      logs, norms = gradients.accumulate_updates(
          lambda batch: self.task.train_step(batch, self.model,
                                             self.optimizer, self.metrics),
          inputs, self._accumulation_steps)
      return self._with_norms(logs, norms)
    with gradients.recording_norms() as norms:
      logs = self.task.train_step(inputs, self.model, self.optimizer,
                                  self.metrics, **self._step_kwargs)
    return self._with_norms(logs, norms)

  def _checked_replica_step(self, inputs):
    """The replica step, after the reference losses of its batch (on the
    weights before the update: automatic control dependencies order
    variable reads and writes as written); with several models, the step
    (its reference runs on one device, `loss_scaling.OneDeviceStep`)."""
    if named.several(self.model):
      return self._replica_step(inputs), ()
    reference = loss_scaling.reference_losses(self.task, self.model, inputs)
    with tf.control_dependencies(reference):
      return self._replica_step(inputs), reference

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
    for name, optimizer in named.named(self.optimizer).items():
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

  def create_train_loop_fn(self):
    """Returns `loop(iterator, num_steps)`, which also records the status.

    Orbit's loop discards step outputs, so a per-loop mean would need a
    metric reset and read in eager mode around every loop: about 1 ms per
    loop here, a fifth of a step at `steps_per_loop=1`. Summing inside the
    compiled loop keeps one `tf.function` call and one read per loop.
    """

    def loop(iterator, num_steps, check_first_step=False):
      total = tf.constant(0.0)
      done = tf.constant(0.0)
      nonfinite_step = tf.constant(-1, tf.int64)
      first_batch = None
      if check_first_step:  # One step, traced once: a new run's first.
        loss, first_batch = self._step(iterator, check_loss_scaling=True)
        finite = tf.math.is_finite(loss)
        total = tf.where(finite, loss, 0.0)
        done = tf.cast(finite, tf.float32)
        nonfinite_step = tf.where(finite, nonfinite_step,
                                  self.global_step.read_value())
      else:
        for _ in tf.range(num_steps):
          loss = self.train_step(iterator)
          # Checked every step, so the run stops at the step that went wrong.
          if not tf.math.is_finite(loss):
            nonfinite_step = self.global_step.read_value()
            break
          total += loss
          done += 1.0
      self._status.assign(tf.stack([
          tf.cast(total / tf.maximum(done, 1.0), tf.float64),
          tf.cast(nonfinite_step, tf.float64), self._scheduled_rate(),
          tf.cast(self.global_step.read_value(), tf.float64)]))
      return first_batch

    self._compiled_loop = None if self._run_eagerly else tf.function(loop)
    return self._compiled_loop or loop

  def traced_loop(self) -> Optional[tf.types.experimental.ConcreteFunction]:
    """Returns the traced training loop; None before the first loop and when
    running eagerly."""
    if getattr(self, "_compiled_loop", None) is None:
      return None
    return self._compiled_loop.get_concrete_function(
        self.train_iterator, tf.TensorSpec([], tf.int32))

  def discard_batch(self) -> None:
    """Reads the next training batch and throws it away."""
    next(self.train_iterator)
    self.discarded_batches.assign_add(1)

  @graph_code.written_for_graphs
  def _scheduled_rate(self) -> tf.Tensor:
    """The learning rate now if it follows a schedule, else NaN."""
    if not self._scheduled:
      return tf.constant(float("nan"), tf.float64)
    return tf.cast(optimization.current_learning_rate(
        named.first(self.optimizer)), tf.float64)

  @graph_code.written_for_graphs
  def train_step(self, iterator) -> tf.Tensor:
    """Runs one step on every replica; returns the global mean loss."""
    return self._step(iterator)

  @graph_code.written_for_graphs
  def _step(self, iterator, check_loss_scaling: bool = False):
    """`train_step`; returns the global mean loss.

    `check_loss_scaling` also records the loss and the reference losses of
    the batch, for `trainer.model.loss_scaling.check`, or with several models the
    first replica's loss, for `check_several`; and returns
    `(loss, the first replica's batch or None)`.
    """
    waited = tf.constant(0.0, tf.float64)
    if self._measures_input_wait():
      # The time `next` blocks is the time the step waited for the input
      # pipeline (prefetched batches return at once). Ordered by automatic
      # control dependencies: timestamps and `next` are stateful.
      start = tf.timestamp()
      batch = next(iterator)
      with tf.control_dependencies(tf.nest.flatten(batch)):
        waited = tf.timestamp() - start
    else:
      batch = next(iterator)
    batch = self._input.split(batch)
    if check_loss_scaling:
      logs, reference = self.strategy.run(self._checked_replica_step,
                                          args=(batch,))
    else:
      logs = self.strategy.run(self._replica_step, args=(batch,))
    if not isinstance(logs, dict) or "loss" not in logs:
      raise errors.ConfigError(
          f"{type(self.task).__name__}.train_step must return a dict with "
          f"`loss`, got {type(logs).__name__}"
          f"{' ' + str(sorted(logs)) if isinstance(logs, dict) else ''}.")
    loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, logs["loss"],
                                axis=None)
    first_batch = None
    if check_loss_scaling and named.several(self.model):
      first_batch = self.strategy.experimental_local_results(batch)[0]
      first = tf.cast(self.strategy.experimental_local_results(
          logs["loss"])[0], tf.float64)
      zero = tf.constant(0.0, tf.float64)
      self._loss_check.assign(tf.stack([tf.cast(loss, tf.float64), first,
                                        zero]))
    elif check_loss_scaling:
      total, count = (self.strategy.reduce(tf.distribute.ReduceOp.SUM, value,
                                           axis=None) for value in reference)
      self._loss_check.assign(tf.stack([tf.cast(loss, tf.float64), total,
                                        count]))
    self._add_extra_scalars(logs)
    norm = finite = tf.constant(0.0, tf.float64)
    if "gradient_norm" in logs:
      self._reports_norm = True
      # Computed from the summed gradients: the same on every replica.
      norm = tf.cast(self.strategy.experimental_local_results(
          logs["gradient_norm"])[0], tf.float64)
      # A skipped float16 step's norm is not finite; it would swamp the mean.
      finite = tf.cast(tf.math.is_finite(norm), tf.float64)
      norm = tf.where(finite > 0, norm, 0.0)
    window = self._window.assign_add(tf.stack(
        [tf.cast(loss, tf.float64), tf.constant(1.0, tf.float64), norm,
         finite, waited]))
    # Counted once the step's batch has come and been trained on: nothing
    # else orders it after `next`, and the tf.data service's stall warning
    # reads the step while a loop runs (measured: it read 1 while the first
    # batch had not come).
    with tf.control_dependencies([window]):
      self.global_step.assign_add(1)
    if check_loss_scaling:
      return tf.cast(loss, tf.float32), first_batch
    return tf.cast(loss, tf.float32)

  @graph_code.written_for_graphs
  def _add_extra_scalars(self, logs: Dict[str, object]) -> None:
    """Adds the replica mean of every other scalar the step returned (an
    override's `penalty`, say) to the window, for the train summaries.

    The window variable is made at the first trace, when the names are
    known, outside the function (`init_scope`), as Keras makes optimizer
    slots.
    """
    names = []
    for name in sorted(set(logs) - {"loss", "gradient_norm"}):
      value = self.strategy.experimental_local_results(logs[name])[0]
      if (isinstance(value, tf.Tensor) and value.shape.rank == 0 and
          (value.dtype.is_floating or value.dtype.is_integer)):
        names.append(name)
      elif name not in self._dropped:
        self._dropped.add(name)
        console.warning(
            f"{type(self.task).__name__}.train_step returned `{name}` "
            f"({getattr(value, 'shape', type(value).__name__)}): only "
            "scalars go to the train summaries")
    if not names:
      return
    if self._extras is None:
      with tf.init_scope(), self._host_scope():
        self._extras = tf.Variable(tf.zeros([len(names)], tf.float64),
                                   trainable=False, name="window_extras")
      self._extra_names = names
    if names != self._extra_names:
      raise errors.ConfigError(
          f"{type(self.task).__name__}.train_step returned the scalars "
          f"{names}, then {self._extra_names}: return the same keys in "
          "every step.")
    # The mean over replicas (a sum of per-replica shares, like `loss`,
    # would need the task to say so).
    means = [tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.SUM,
                                          logs[name], axis=None), tf.float64)
             / self.strategy.num_replicas_in_sync for name in names]
    self._extras.assign_add(tf.stack(means))

  def loop_status(self) -> LoopStatus:
    """Reads what the last loop reported, in one device read.

    A loop returns no output of its own (`train` returns None): its loss
    and scheduled learning rate are read here, and the controller gives
    them to its train actions.
    """
    loss, nonfinite_step, learning_rate, step = self._status.numpy()
    return LoopStatus(float(loss), int(nonfinite_step),
                      None if math.isnan(learning_rate) else
                      float(learning_rate), int(step))

  def read_and_reset_metrics(self) -> Dict[str, float]:
    """Returns the window's mean loss, gradient norm (when the step reports
    one), seconds waited for input (`input_wait_seconds`) and task metrics,
    and the learning rate now; resets the window."""
    loss, steps, norm, finite, waited = self._window.numpy()
    results = {"loss": loss / max(steps, 1.0)}
    if self._reports_norm:
      results["gradient_norm"] = norm / max(finite, 1.0)
    if self._extras is not None:
      results.update(zip(self._extra_names,
                         self._extras.numpy() / max(steps, 1.0)))
      self._extras.assign(tf.zeros_like(self._extras))
    results.update({metric.name: metric.result() for metric in self.metrics})
    for metric in self.metrics:
      metric.reset_state()
    self._window.assign(tf.zeros([5], tf.float64))
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
    return results

  @graph_code.written_for_graphs
  def _measures_input_wait(self) -> bool:
    """Whether steps time their wait for input.

    Not under op determinism, where TensorFlow refuses `tf.timestamp`.
    (The public API can enable determinism but not ask for it.)
    """
    return not framework_config.is_op_determinism_enabled()
