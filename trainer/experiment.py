"""Wires a Task, the runtime and the Orbit controller together for a mode."""

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
from typing import Any, Dict, Optional

from absl import logging
import gin
import orbit
import tensorflow as tf
import tf_keras

from trainer import checkpoints
from trainer import cluster
from trainer import controller as controller_lib
from trainer import errors
from trainer import inputs as inputs_lib
from trainer import preemption
from trainer import runners
from trainer import runtime as runtime_lib
from trainer import scaling
from trainer import summaries
from trainer import task as task_lib

MODES = ("train", "eval", "train_and_eval", "continuous_eval")
NONFINITE_POLICIES = ("stop", "rollback")


@gin.configurable("trainer")
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """Loop, evaluation and checkpoint settings, bound as `trainer.<name>`.

  Attributes:
    train_steps: Train until the global step reaches this.
    steps_per_loop: Steps run inside one `tf.function` call; progress is
      reported once per loop.
    global_batch_size: Training examples per step over all replicas.
    eval_batch_size: Evaluation examples per step over all replicas.
    validation_steps: Eval batches per evaluation; -1 is one full pass over
      the eval split, partial last batch included.
    validation_interval: Evaluate every this many steps in `train_and_eval`;
      0 evaluates only at the end.
    checkpoint_interval: Save when the step reaches a multiple of this; a
      checkpoint is always saved when training ends.
    summary_interval: Write train summaries every this many steps; a multiple
      of `steps_per_loop`.
    max_to_keep: Newest checkpoints kept.
    continuous_eval_timeout: `continuous_eval` gives up after waiting this
      many seconds for a new checkpoint.
    batch_scaling: None, `keep_global_batch` or `keep_per_replica_batch`:
      how batch sizes and the learning rate follow a replica count other
      than `reference_replicas` (see `trainer.scaling`).
    reference_replicas: The replica count the batch sizes are written for.
    on_nonfinite: What a non-finite training loss does: "stop" ends the run
      with an error naming the step; "rollback" restores the newest
      checkpoint and skips the batch of that step.
    max_rollbacks: With "rollback", stop anyway after this many.
    preemption_exit_code: Exit code after SIGTERM/SIGINT, once a checkpoint
      at the step reached is saved; tells a launcher to restart the job.
  """
  train_steps: int = 1000
  steps_per_loop: int = 100
  global_batch_size: int = 64
  eval_batch_size: int = 256
  validation_steps: int = -1
  validation_interval: int = 0
  checkpoint_interval: int = 1000
  summary_interval: int = 100
  max_to_keep: int = 5
  continuous_eval_timeout: float = 3600.0
  batch_scaling: Optional[str] = None
  reference_replicas: int = 1
  on_nonfinite: str = "stop"
  max_rollbacks: int = 3
  preemption_exit_code: int = 42

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.type is int and (not isinstance(value, int) or
                                isinstance(value, bool)):
        raise errors.ConfigError(
            f"`trainer.{field.name}` ({value!r}) must be an "
            "integer.")
    positive = ("train_steps", "steps_per_loop", "global_batch_size",
                "eval_batch_size", "checkpoint_interval", "summary_interval",
                "max_to_keep")
    for name in positive:
      if getattr(self, name) < 1:
        raise errors.ConfigError(
            f"`trainer.{name}` ({getattr(self, name)}) must be "
            "positive.")
    if self.validation_steps == 0 or self.validation_steps < -1:
      raise errors.ConfigError(
          f"`trainer.validation_steps` ({self.validation_steps})"
          " must be positive, or -1 for a full pass.")
    if self.validation_interval < 0:
      raise errors.ConfigError("`trainer.validation_interval` "
                       f"({self.validation_interval}) must be >= 0.")
    for name in ("summary_interval", "checkpoint_interval",
                 "validation_interval"):
      # Summaries, saves and evaluations happen between loops only.
      if getattr(self, name) % self.steps_per_loop:
        raise errors.ConfigError(
            f"`trainer.{name}` ({getattr(self, name)}) must be a multiple of "
            f"`trainer.steps_per_loop` ({self.steps_per_loop}).")
    if self.on_nonfinite not in NONFINITE_POLICIES:
      raise errors.ConfigError(
          f"`trainer.on_nonfinite` ({self.on_nonfinite!r}) must be one of: "
          f"{', '.join(NONFINITE_POLICIES)}.")
    if self.max_rollbacks < 0:
      raise errors.ConfigError(
          f"`trainer.max_rollbacks` ({self.max_rollbacks}) must be >= 0.")
    if not 1 <= self.preemption_exit_code <= 255:
      raise errors.ConfigError(
          f"`trainer.preemption_exit_code` ({self.preemption_exit_code}) "
          "must be in [1, 255]: 0 tells a scheduler the job finished.")
    if self.batch_scaling is not None and (
        self.batch_scaling not in scaling.RULES):
      raise errors.ConfigError(
          f"`trainer.batch_scaling` ({self.batch_scaling!r}) must be None or "
          f"one of: {', '.join(scaling.RULES)}.")
    if self.reference_replicas < 1:
      raise errors.ConfigError(
          f"`trainer.reference_replicas` ({self.reference_replicas}) must be "
          "positive.")
    if (not isinstance(self.continuous_eval_timeout, (int, float)) or
        self.continuous_eval_timeout <= 0):
      raise errors.ConfigError("`trainer.continuous_eval_timeout` "
                       f"({self.continuous_eval_timeout!r}) must be positive.")


def _ensure_built(model: tf_keras.Model, element_spec) -> None:
  """Builds `model` from the input spec so checkpoints restore at once."""
  if model.built:
    return
  features_spec = element_spec[0]
  dummy = tf.nest.map_structure(
      lambda spec: tf.zeros([1] + spec.shape.as_list()[1:], spec.dtype),
      features_spec)
  model(dummy, training=False)


def optimizer_scalars(
    optimizer: tf_keras.optimizers.Optimizer) -> Dict[str, float]:
  """Returns the learning rate now (schedules included) and the loss scale."""
  rate = optimizer.learning_rate
  if callable(rate):
    rate = rate(optimizer.iterations)
  scalars = {"learning_rate": float(tf.convert_to_tensor(rate))}
  if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
    scalars["loss_scale"] = float(optimizer.loss_scale)
  return scalars


def run(task: task_lib.Task, mode: str, model_dir: str,
        runtime: Optional[runtime_lib.RuntimeConfig] = None,
        config: Optional[TrainerConfig] = None,
        restore_dir: Optional[str] = None) -> Dict[str, Any]:
  """Trains and/or evaluates `task` in `model_dir`.

  Args:
    task: What to train.
    mode: One of `MODES`.
    model_dir: Checkpoints, `train/` and `eval/` summaries and
      `operative_config.gin` go here.
    runtime: Devices, strategy and precision; defaults if None.
    config: Loop settings; defaults if None.
    restore_dir: Where to look for the checkpoint to start from, if not in
      `model_dir` (`--dry_run` starts from the real run's checkpoint but
      writes elsewhere); it is only read.

  Returns:
    The last evaluation's results (name -> NumPy value), or {} if none ran.

  Raises:
    errors.ConfigError: For an unknown mode, or `eval` without a checkpoint.
  """
  runtime = runtime or runtime_lib.RuntimeConfig()
  config = config or TrainerConfig()
  if mode not in MODES:
    raise errors.ConfigError(
        f"`mode` ({mode!r}) must be one of: {', '.join(MODES)}.")
  training = mode in ("train", "train_and_eval")
  evaluating = mode != "train"
  if runtime.distribution_strategy == "parameter_server":
    if config.on_nonfinite == "rollback":
      raise errors.ConfigError(
          "`trainer.on_nonfinite='rollback'` is not supported with "
          "'parameter_server': use 'stop' and restart.")
    runtime = _parameter_server_role(runtime, mode)
    if runtime is None:
      return {}  # This process served as a worker or ps until stopped.
  restore_dir = restore_dir or model_dir
  if mode == "eval" and tf.train.latest_checkpoint(restore_dir) is None:
    raise errors.ConfigError(
        f"no checkpoint to evaluate in `model_dir` ({restore_dir}).")

  strategy = runtime_lib.create_strategy(runtime)
  runtime_lib.set_precision_policy(runtime)
  runtime_lib.seed_everything(runtime)
  worker = cluster.worker_info(strategy)
  config, learning_rate_factor = scaling.rescale(
      config, strategy.num_replicas_in_sync)
  if config.batch_scaling is not None:
    print(f"scaling | {strategy.num_replicas_in_sync} replica(s), reference "
          f"{config.reference_replicas}: global batch "
          f"{config.global_batch_size}, eval batch {config.eval_batch_size}, "
          f"learning rate x{learning_rate_factor:g}", flush=True)
  coordinator = None
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver(
    ).cluster_spec()
    num_workers = spec.num_tasks("worker")
    print(f"cluster | coordinator schedules steps on {num_workers} worker(s);"
          f" variables on {spec.num_tasks('ps')} ps", flush=True)
    if training and num_workers > 1:
      print(f"input | worker i of {num_workers} reads examples i, "
            f"i + {num_workers}, ... of the task's training data", flush=True)
  logging.info("strategy %s with %d replica(s); worker %d of %d",
               type(strategy).__name__, strategy.num_replicas_in_sync,
               worker.worker_index, worker.num_workers)
  train_input = eval_input = None
  if training:
    train_input = _train_input(task, strategy, config, runtime, worker)
  if evaluating:
    # Every worker evaluates the whole eval split: the same number of steps
    # everywhere (no collective waits on a worker with fewer batches), and
    # the metrics, summed over all replicas, keep their ratios.
    eval_input = inputs_lib.DistributedInput(
        strategy, lambda ctx: task.build_inputs(False, ctx),
        config.eval_batch_size, training=False,
        batch_size_name="trainer.eval_batch_size", worker=worker,
        shard=False)
  with strategy.scope():
    model = task.build_model()
    _ensure_built(model, (train_input or eval_input).dataset.element_spec)
    global_step = orbit.utils.create_global_step()
    optimizer = None
    if training:
      optimizer = runtime_lib.wrap_optimizer(task.create_optimizer(), runtime)
      scaling.scale_learning_rate(optimizer, learning_rate_factor)
      if config.on_nonfinite == "rollback":
        # A rollback may go back to a checkpoint saved before the first step;
        # it must hold the optimizer slots too, or they would keep the
        # non-finite values.
        optimizer.build(model.trainable_variables)

  trainer = evaluator = None
  checkpoint_items = {"model": model, "global_step": global_step}
  if training:
    trainer = runners.TaskTrainer(
        task, model, optimizer, strategy, train_input, global_step,
        run_eagerly=runtime.run_eagerly, enable_xla=runtime.enable_xla,
        coordinator=coordinator)
    checkpoint_items["optimizer"] = optimizer
    checkpoint_items["discarded_batches"] = trainer.discarded_batches
    input_in_checkpoint = (worker.num_workers == 1 and coordinator is None and
                           inputs_lib.is_checkpointable(train_input.dataset))
    if input_in_checkpoint:
      checkpoint_items["train_iterator"] = trainer.train_iterator
    elif coordinator is not None:
      # Workers take steps in no fixed order: no position to resume exactly.
      logging.warning("parameter_server: the input position is not "
                      "checkpointed; a restarted run reads each worker's "
                      "shard from its start.")
  if evaluating:
    evaluator = runners.TaskEvaluator(task, model, strategy, eval_input,
                                      global_step,
                                      run_eagerly=runtime.run_eagerly)

  resume_input_fn = None
  if training and not input_in_checkpoint and coordinator is None:
    resume_input_fn = trainer.skip_input
  finite_fn = None
  if training:
    finite_fn = lambda: _all_finite(model.variables + optimizer.variables())

  with _write_directory(model_dir, worker) as write_dir, (
      preemption.PreemptionWatcher() if training else
      contextlib.nullcontext()) as watcher:
    if training and worker.is_chief:
      checkpoints.remove_interrupted_saves(write_dir)
    manager = checkpoints.create_manager(
        tf.train.Checkpoint(**checkpoint_items), write_dir, config.max_to_keep,
        global_step,
        init_fn=(lambda: task.initialize(model)) if training else None)
    train_writer = None
    if training:
      train_writer = summaries.LazyWriter(os.path.join(write_dir, "train"))
    controller = controller_lib.Controller(
        global_step=global_step,
        trainer=trainer,
        evaluator=evaluator,
        strategy=strategy,
        train_actions=[_OperativeConfigWriter(write_dir, train_writer),
                       _StatefulRandomCheck(trainer, runtime.deterministic)]
        if training else None,
        steps_per_loop=config.steps_per_loop if training else None,
        checkpoint_manager=manager,
        summary_interval=config.summary_interval if training else None,
        eval_summary_dir=(os.path.join(write_dir, "eval")
                          if evaluating else None),
        train_steps=config.train_steps,
        checkpoint_interval=config.checkpoint_interval,
        global_batch_size=config.global_batch_size,
        train_summary_writer=train_writer,
        scalars_fn=(lambda: optimizer_scalars(optimizer)) if training else None,
        partial_restore=not training,
        restore_dir=restore_dir,
        on_nonfinite=config.on_nonfinite,
        max_rollbacks=config.max_rollbacks,
        finite_fn=finite_fn,
        resume_input_fn=resume_input_fn,
        preemption=watcher,
        preemption_exit_code=config.preemption_exit_code,
        num_workers=worker.num_workers)

    if resume_input_fn is not None and controller.step:
      # The chief's checkpoint cannot hold every worker's iterator (and some
      # pipelines cannot be saved at all): skip what was consumed instead.
      skipped = resume_input_fn(controller.step)
      print(f"input | resuming: skips the {skipped} batch(es) trained on "
            "before", flush=True)
    if mode == "eval":
      return controller.evaluate(config.validation_steps)
    if mode == "continuous_eval":
      return _evaluate_continuously(controller, model_dir, config)
    output = {}
    with _empty_input_is_a_config_error():
      if mode == "train":
        controller.train(config.train_steps)
      else:
        output = controller.train_and_evaluate(
            config.train_steps, config.validation_steps,
            eval_interval=config.validation_interval or None)
        if output is None:  # Already trained to `train_steps`: evaluate.
          output = controller.evaluate(config.validation_steps)
    print(f"train | finished at step {controller.step} | weights fingerprint "
          f"{weights_fingerprint(model)}", flush=True)
    return output


def _parameter_server_role(runtime: runtime_lib.RuntimeConfig,
                           mode: str) -> Optional[runtime_lib.RuntimeConfig]:
  """Acts on this process's parameter-server cluster role.

  Returns:
    None after serving as a worker or ps (until stopped); otherwise the
    runtime to train (chief) or evaluate (evaluator, on no strategy) with.

  Raises:
    errors.ConfigError: If the role cannot run `mode`.
  """
  role, index = cluster.task_role()
  if role in ("worker", "ps"):
    cluster.serve_forever(role, index)
    return None
  if role == "evaluator":
    # The sidecar evaluator reads the chief's checkpoints on its own.
    if mode not in ("eval", "continuous_eval"):
      raise errors.ConfigError(
          "the evaluator task runs --mode=continuous_eval (or eval).")
    return dataclasses.replace(runtime, distribution_strategy="default")
  if mode != "train":
    raise errors.ConfigError(
        "with 'parameter_server' the chief runs --mode=train; evaluation "
        "runs in an `evaluator` task (--mode=continuous_eval).")
  return runtime


def _train_input(task: task_lib.Task, strategy: tf.distribute.Strategy,
                 config: TrainerConfig, runtime: runtime_lib.RuntimeConfig,
                 worker: cluster.WorkerInfo) -> inputs_lib.DistributedInput:
  """Builds this worker's training input and says which shard it reads."""
  train_input = inputs_lib.DistributedInput(
      strategy, lambda ctx: task.build_inputs(True, ctx),
      config.global_batch_size, training=True,
      batch_size_name="trainer.global_batch_size", worker=worker,
      private_threads=runtime.dataset_num_private_threads)
  if worker.num_workers > 1:
    context = train_input.input_context
    print(f"input | worker {worker.worker_index} reads input pipeline "
          f"{context.input_pipeline_id} of {context.num_input_pipelines}",
          flush=True)
  return train_input


@contextlib.contextmanager
def _empty_input_is_a_config_error():
  """Turns the end of a repeated training input into a clear error.

  The training input repeats forever, so it only ends when it holds no
  complete batch at all.
  """
  try:
    yield
  except tf.errors.OutOfRangeError as e:
    raise errors.ConfigError(
        "the training dataset yields no batch: it is empty, or smaller than "
        "one batch.") from e


def _all_finite(variables) -> bool:
  """Whether every value of every variable is finite (one device read)."""
  checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables
            if v.dtype.is_floating]
  return bool(tf.reduce_all(checks).numpy()) if checks else True


@contextlib.contextmanager
def _write_directory(model_dir: str, worker: cluster.WorkerInfo):
  """Yields where this process writes: `model_dir` for the chief only.

  Other workers take part in every save and summary (they may involve
  collectives) but write into a temporary directory of their own, removed
  afterwards, so no two processes ever write the same file.
  """
  if worker.is_chief:
    os.makedirs(model_dir, exist_ok=True)
    yield model_dir
    return
  directory = tempfile.mkdtemp(prefix=f"worker{worker.worker_index}-")
  try:
    yield directory
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def weights_fingerprint(model: tf_keras.Model) -> str:
  """Returns a short hash of every weight's bytes, in `model.weights` order.

  Equal fingerprints mean bit-identical weights: compare them across
  workers, replicas or reruns.
  """
  digest = hashlib.sha256()
  for weight in model.weights:
    digest.update(weight.numpy().tobytes())
  return digest.hexdigest()[:16]


class _OperativeConfigWriter:
  """Train action: saves the operative gin config once, after the first loop.

  Gin only knows which parameters were used once the configurables ran.
  """

  def __init__(self, model_dir: str,
               writer: Optional[summaries.Writer]):
    self._model_dir = model_dir
    self._writer = writer
    self._done = False

  def __call__(self, unused_output) -> None:
    if self._done:
      return
    self._done = True
    path = summaries.write_operative_config(self._model_dir, self._writer,
                                            step=0)
    logging.info("wrote %s", path)


class _StatefulRandomCheck:
  """Train action: after the first loop, warns about stateful random ops.

  Only with `runtime.deterministic`, where the user asked for exactness.
  """

  def __init__(self, trainer: runners.TaskTrainer, enabled: bool):
    self._trainer = trainer
    self._done = not enabled

  def __call__(self, unused_output) -> None:
    if self._done:
      return
    self._done = True
    found = self._trainer.stateful_random_ops()
    if found:
      message = (
          "runtime.deterministic: the train step uses stateful random ops "
          f"({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}); "
          "their state is not checkpointed, so a resumed run will differ. "
          "Use tf.random.stateless_* ops seeded from the step.")
      logging.warning(message)
      print(f"warning | {message}", flush=True)


def _evaluate_continuously(controller: controller_lib.Controller,
                           model_dir: str,
                           config: TrainerConfig) -> Dict[str, Any]:
  """Evaluates each new checkpoint until one at `train_steps` or later."""
  output = {}
  for path in tf.train.checkpoints_iterator(
      model_dir, timeout=config.continuous_eval_timeout):
    controller.restore_checkpoint(path)
    output = controller.evaluate(config.validation_steps)
    if controller.step >= config.train_steps:
      break
  else:
    logging.warning("no new checkpoint in %s for %s s; stopping.", model_dir,
                    config.continuous_eval_timeout)
  return output
