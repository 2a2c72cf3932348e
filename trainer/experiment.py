"""Wires a Task, the runtime and the Orbit controller together for a mode.

`run` builds, in order: the strategy, the inputs, the model and optimizer
(in the strategy scope), the Orbit trainer and evaluator, the checkpoint
manager, the actions between loops, and the controller; then it runs the
mode. Each feature lives in its own module; this one only connects them.
"""

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional

from absl import logging
import orbit
import tensorflow as tf
import tf_keras

from trainer import actions
from trainer import checkpoints
from trainer import cluster
from trainer import config as config_lib
from trainer import console
from trainer import continuous_eval
from trainer import controller as controller_lib
from trainer import errors
from trainer import exports
from trainer import gradients
from trainer import inputs as inputs_lib
from trainer import lease
from trainer import optimization
from trainer import preemption
from trainer import profiler
from trainer import runners
from trainer import runtime as runtime_lib
from trainer import scaling
from trainer import summaries
from trainer import task as task_lib

MODES = ("train", "eval", "train_and_eval", "continuous_eval")
TrainerConfig = config_lib.TrainerConfig


def ensure_built(model: tf_keras.Model, element_spec) -> None:
  """Builds `model` from the input spec so checkpoints restore at once.

  Raises:
    errors.ConfigError: If the model declares inputs one rank lower than
      the batched features: the examples were batched already.
  """
  if model.built:
    check_input_ranks(model, element_spec[0])
    return
  features_spec = element_spec[0]
  dummy = tf.nest.map_structure(
      lambda spec: tf.zeros([1] + spec.shape.as_list()[1:], spec.dtype),
      features_spec)
  model(dummy, training=False)


def check_input_ranks(model: tf_keras.Model, features_spec) -> None:
  """Raises if batched features have one rank more than the model's inputs
  (`build_inputs` batched with a fixed size, `batch(n, drop_remainder=True)`).

  Raises:
    errors.ConfigError: Naming `build_inputs`.
  """
  inputs = getattr(model, "inputs", None) or []
  specs = tf.nest.flatten(features_spec)
  if len(inputs) != len(specs):
    return
  for model_input, spec in zip(inputs, specs):
    if (model_input.shape.rank is not None and spec.shape.rank is not None
        and spec.shape.rank == model_input.shape.rank + 1):
      raise errors.ConfigError(
          f"`build_inputs` returns batched data: the model takes inputs of "
          f"shape {model_input.shape} but each example has shape "
          f"{spec.shape[1:]}: return single examples and let the framework "
          "batch them (remove `.batch(...)`).")


def loss_scale_scalars(
    optimizer: tf_keras.optimizers.Optimizer) -> Dict[str, float]:
  """Returns the float16 loss scale as a scalar, if there is one."""
  if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
    return {"loss_scale": float(optimizer.loss_scale)}
  return {}


def build_optimizer(task: task_lib.Task, model: tf_keras.Model,
                     config: TrainerConfig, runtime: runtime_lib.RuntimeConfig,
                     replica_factor: float) -> tf_keras.optimizers.Optimizer:
  """Builds the task's optimizer, scaled, averaged and loss-scaled.

  Call inside the strategy scope.

  Args:
    task: Creates the optimizer.
    model: The model (EMA averages its weights).
    config: The optimizer, schedule, EMA and batch settings.
    runtime: The precision (float16 adds loss scaling).
    replica_factor: The learning-rate factor of `trainer.batch_scaling`.
  """
  optimizer = task.create_optimizer(optimization.Settings(
      config.optimizer, config.learning_rate, config.train_steps))
  batch_factor = optimization.learning_rate_factor(config.learning_rate,
                                                   config.global_batch_size)
  factor = replica_factor if batch_factor is None else batch_factor
  scaling.scale_learning_rate(optimizer, factor)
  if batch_factor is not None and batch_factor != 1.0:
    print(f"learning rate | x{batch_factor:g} for global batch "
          f"{config.global_batch_size} (rates are written for "
          f"{config.learning_rate.reference_batch_size})", flush=True)
  optimizer = optimization.add_ema(optimizer, model, config.ema)
  return runtime_lib.wrap_optimizer(optimizer, runtime)


@errors.raised_as_is()
def run(task: task_lib.Task, mode: str, model_dir: str,
        runtime: Optional[runtime_lib.RuntimeConfig] = None,
        config: Optional[TrainerConfig] = None,
        restore_dir: Optional[str] = None) -> Dict[str, Any]:
  """Trains and/or evaluates `task` in `model_dir`.

  Args:
    task: What to train.
    mode: One of `MODES`.
    model_dir: Checkpoints, `train/` and `eval/` summaries,
      `operative_config.gin`, `best/` and `export/` go here.
    runtime: Devices, strategy and precision; defaults if None.
    config: Loop settings; defaults if None.
    restore_dir: Where to look for the checkpoint to start from, if not in
      `model_dir` (`--dry_run` starts from the real run's checkpoint but
      writes elsewhere); it is only read.

  Returns:
    The last evaluation's results (name -> NumPy value), or {} if none ran.

  Raises:
    errors.ConfigError: For an unknown mode, `eval` without a checkpoint, and
      settings that do not fit the task or the strategy.
  """
  runtime = runtime or runtime_lib.RuntimeConfig()
  config = config or TrainerConfig()
  if mode not in MODES:
    raise errors.ConfigError(
        f"`mode` ({mode!r}) must be one of: {', '.join(MODES)}.")
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
  parts = _build(task, mode, runtime, config)
  with _write_directory(model_dir, parts.worker, mode,
                        parts.config) as write_dir, (
      preemption.PreemptionWatcher() if parts.training else
      contextlib.nullcontext()) as watcher:
    early_stopping = None
    if parts.config.early_stopping.metric is not None:
      early_stopping = actions.EarlyStopping(
          write_dir, parts.config.early_stopping, step_fn=parts.step)
    controller = _controller(parts, write_dir, restore_dir, watcher,
                             early_stopping)
    if parts.resume_input_fn is not None and controller.step:
      # The chief's checkpoint cannot hold every worker's iterator (and some
      # pipelines cannot be saved at all): skip what was consumed instead.
      skipped = parts.resume_input_fn(controller.step)
      print(f"input | resuming: skips the {skipped} batch(es) trained on "
            "before", flush=True)
    return _run_mode(parts, controller, mode, model_dir, write_dir,
                     early_stopping)


@dataclasses.dataclass
class _Parts:
  """What `run` builds for a mode before the controller.

  Attributes:
    task: What is trained.
    config: The loop settings, with batches rescaled for the replicas.
    runtime: The runtime settings.
    strategy: The distribution strategy.
    worker: This process's place among the workers.
    training: Whether the mode trains.
    evaluating: Whether the mode evaluates.
    model: The model.
    optimizer: The optimizer (None in eval modes without EMA).
    global_step: The global step.
    checkpoint: What checkpoints hold.
    trainer: Orbit trainer, when training.
    evaluator: Orbit evaluator, when evaluating.
    resume_input_fn: Skips consumed input on resume where the iterator is
      not in the checkpoint; None otherwise.
    features_spec: The eval input's features, for export signatures.
  """
  task: task_lib.Task
  config: TrainerConfig
  runtime: runtime_lib.RuntimeConfig
  strategy: tf.distribute.Strategy
  worker: cluster.WorkerInfo
  training: bool
  evaluating: bool
  model: tf_keras.Model
  optimizer: Optional[tf_keras.optimizers.Optimizer]
  global_step: tf.Variable
  checkpoint: tf.train.Checkpoint
  trainer: Optional[runners.TaskTrainer] = None
  evaluator: Optional[runners.TaskEvaluator] = None
  resume_input_fn: Optional[Callable[[int], int]] = None
  features_spec: Any = None

  def step(self) -> int:
    return int(self.global_step.numpy())

  def averaged_weights(self):
    """A context in which the model holds its EMA weights, if any."""
    return optimization.averaged_weights(self.optimizer, self.strategy)

  def all_finite(self) -> bool:
    """Whether every model and optimizer variable is finite."""
    return _all_finite(self.model.variables +
                       optimization.optimizer_variables(self.optimizer))

  def export(self, directory: str) -> None:
    """Writes a serving SavedModel (EMA weights, if any) to `directory`."""
    with self.averaged_weights():
      exports.export(
          self.model, self.task.export_signatures(self.model,
                                                  self.features_spec),
          directory)


def _build(task: task_lib.Task, mode: str,
           runtime: runtime_lib.RuntimeConfig,
           config: TrainerConfig) -> _Parts:
  """Builds the strategy, inputs, model, optimizer and Orbit runners."""
  training = mode in ("train", "train_and_eval")
  evaluating = mode != "train"
  strategy = runtime_lib.create_strategy(runtime)
  runtime_lib.set_precision_policy(runtime)
  runtime_lib.seed_everything(runtime)
  worker = cluster.worker_info(strategy)
  config, replica_factor = scaling.rescale(
      config, strategy.num_replicas_in_sync)
  if config.batch_scaling is not None:
    print(f"scaling | {strategy.num_replicas_in_sync} replica(s), reference "
          f"{config.reference_replicas}: global batch "
          f"{config.global_batch_size}, eval batch {config.eval_batch_size}, "
          f"learning rate x{replica_factor:g}", flush=True)
  coordinator = None
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    coordinator = _coordinator(strategy, training)
  logging.info("strategy %s with %d replica(s); worker %d of %d",
               type(strategy).__name__, strategy.num_replicas_in_sync,
               worker.worker_index, worker.num_workers)
  train_input = eval_input = None
  if training:
    train_input = make_input(task, True, strategy, config, runtime, worker)
    if worker.num_workers > 1:
      context = train_input.input_context
      print(f"input | worker {worker.worker_index} reads input pipeline "
            f"{context.input_pipeline_id} of {context.num_input_pipelines}",
            flush=True)
  if evaluating or config.export.at_end:
    eval_input = make_input(task, False, strategy, config, runtime, worker)
    if evaluating:  # -1 (UNKNOWN) or -2 (INFINITE): checked as it runs.
      inputs_lib.check_validation_steps(
          config.validation_steps, int(eval_input.dataset.cardinality()))
  with strategy.scope():
    model = task.build_model()
    ensure_built(model, (train_input or eval_input).dataset.element_spec)
    global_step = orbit.utils.create_global_step()
    optimizer = None
    if training or config.ema.enabled:
      # Evaluation builds it too with EMA: the averages are its slots.
      optimizer = build_optimizer(task, model, config, runtime,
                                  replica_factor)
    if training and config.on_nonfinite == "rollback":
      # A rollback may go back to a checkpoint saved before the first step;
      # it must hold the optimizer slots too, or they would keep the
      # non-finite values.
      optimization.create_slots(optimizer, model.trainable_variables)
  items = {"model": model, "global_step": global_step}
  if optimizer is not None:
    items["optimizer"] = optimizer
  parts = _Parts(
      task=task, config=config, runtime=runtime, strategy=strategy,
      worker=worker, training=training, evaluating=evaluating, model=model,
      optimizer=optimizer, global_step=global_step, checkpoint=None,
      features_spec=eval_input.dataset.element_spec[0] if eval_input else None)
  if training:
    parts.trainer = runners.TaskTrainer(
        task, model, optimizer, strategy, train_input, global_step,
        run_eagerly=runtime.run_eagerly, enable_xla=runtime.enable_xla,
        step_options=step_options(config), coordinator=coordinator)
    items["discarded_batches"] = parts.trainer.discarded_batches
    if (config.input_position == "checkpoint" and worker.num_workers == 1 and
        coordinator is None and
        inputs_lib.is_checkpointable(train_input.dataset)):
      items["train_iterator"] = parts.trainer.train_iterator
    elif coordinator is not None:
      # Workers take steps in no fixed order: no position to resume exactly.
      logging.warning("parameter_server: the input position is not "
                      "checkpointed; a restarted run reads each worker's "
                      "shard from its start.")
    elif config.input_position != "restart":
      parts.resume_input_fn = parts.trainer.skip_input
  if evaluating:
    parts.evaluator = runners.TaskEvaluator(
        task, model, strategy, eval_input, global_step,
        run_eagerly=runtime.run_eagerly, weights=parts.averaged_weights)
  parts.checkpoint = tf.train.Checkpoint(**items)
  return parts


def _controller(parts: _Parts, write_dir: str, restore_dir: str,
                watcher: Optional[preemption.PreemptionWatcher],
                early_stopping: Optional[actions.EarlyStopping]
                ) -> controller_lib.Controller:
  """Builds the controller (which restores the newest checkpoint) and the
  actions between loops."""
  config, training = parts.config, parts.training
  manager = checkpoints.create_manager(
      parts.checkpoint, write_dir, config.max_to_keep, parts.global_step,
      init_fn=((lambda: parts.task.initialize(parts.model, config.warm_start))
               if training else None),
      evaluated_fn=(
          (lambda: continuous_eval.read_evaluated(write_dir))
          if training and config.keep_until_evaluated else None))
  train_writer = None
  if training:
    train_writer = summaries.LazyWriter(os.path.join(write_dir, "train"))
  controller = controller_lib.Controller(
      global_step=parts.global_step,
      trainer=parts.trainer,
      evaluator=parts.evaluator,
      strategy=parts.strategy,
      train_actions=[
          actions.OperativeConfigWriter(write_dir, train_writer),
          actions.StatefulRandomCheck(parts.trainer.stateful_random_ops,
                                      parts.runtime.deterministic)]
      if training else None,
      steps_per_loop=config.steps_per_loop if training else None,
      checkpoint_manager=manager,
      summary_interval=config.summary_interval if training else None,
      eval_summary_dir=(os.path.join(write_dir, "eval")
                        if parts.evaluating else None),
      train_steps=config.train_steps,
      checkpoint_interval=config.checkpoint_interval,
      global_batch_size=config.global_batch_size,
      train_summary_writer=train_writer,
      scalars_fn=(lambda: loss_scale_scalars(parts.optimizer)) if training
      else None,
      partial_restore=not training,
      restore_dir=restore_dir,
      on_nonfinite=config.on_nonfinite,
      max_rollbacks=config.max_rollbacks,
      finite_fn=parts.all_finite if training else None,
      resume_input_fn=parts.resume_input_fn,
      preemption=watcher,
      preemption_exit_code=config.preemption_exit_code,
      num_workers=parts.worker.num_workers,
      stop_fn=early_stopping.stop_reason if (
          early_stopping is not None and training) else None,
      profile=(profiler.ProfileWindow(config.profile_steps,
                                      os.path.join(write_dir, "train"))
               if training and config.profile_steps else None))
  # Added once the controller exists: keeping the best checkpoint of an
  # evaluated checkpoint on disk copies the one the controller restored.
  controller.eval_actions = tuple(
      _eval_actions(parts, controller, write_dir, early_stopping))
  return controller


def _eval_actions(parts: _Parts, controller: controller_lib.Controller,
                  write_dir: str,
                  early_stopping: Optional[actions.EarlyStopping]) -> list:
  """Returns the actions after each evaluation: best checkpoint, early
  stopping."""
  found = []
  if parts.config.best_checkpoint.metric is not None and parts.evaluating:

    def save_best(prefix: str) -> None:
      if parts.training:
        parts.checkpoint.write(prefix)
      else:  # Evaluating a checkpoint on disk: copy it, optimizer and all.
        checkpoints.copy(controller.restored_path, prefix)

    found.append(actions.BestCheckpoint(
        write_dir, parts.config.best_checkpoint, step_fn=parts.step,
        save_fn=save_best,
        export_fn=parts.export if parts.config.export.best else None))
  if early_stopping is not None and parts.evaluating:
    found.append(early_stopping)
  if parts.training and parts.evaluating:
    record = continuous_eval.EvaluatedRecord(write_dir)
    found.append(lambda output: record.add(parts.step(), output))
  return found


def _run_mode(parts: _Parts, controller: controller_lib.Controller,
              mode: str, model_dir: str, write_dir: str,
              early_stopping: Optional[actions.EarlyStopping]
              ) -> Dict[str, Any]:
  """Runs `mode` with the built controller; returns the last eval results."""
  config = parts.config
  if mode == "eval":
    return controller.evaluate(config.validation_steps)
  if mode == "continuous_eval":
    return _evaluate_continuously(controller, model_dir, config,
                                  early_stopping)
  output = {}
  if mode == "train":
    controller.train(config.train_steps)
  else:
    caught_up = None
    if _evaluation_missed(controller.step, config, write_dir):
      # Stopped between saving this step and evaluating it: the
      # evaluation (and a best checkpoint it may make) is not lost.
      console.info(f"eval | step {controller.step} was saved but not "
                   "evaluated: evaluating it first")
      caught_up = controller.evaluate(config.validation_steps)
    output = controller.train_and_evaluate(
        config.train_steps, config.validation_steps,
        eval_interval=config.validation_interval or None)
    if output is None:  # Nothing (more) trained: the last evaluation.
      output = caught_up or controller.evaluate(config.validation_steps)
  if config.export.at_end:
    directory = os.path.join(write_dir, "export", str(controller.step))
    parts.export(directory)
    print(f"export | SavedModel of step {controller.step} in {directory}",
          flush=True)
  print(f"train | finished at step {controller.step} | weights fingerprint "
        f"{weights_fingerprint(parts.model)}", flush=True)
  return output


def _evaluation_missed(step: int, config: TrainerConfig,
                       write_dir: str) -> bool:
  """Whether `train_and_eval` was due to evaluate `step` (the restored one,
  below `train_steps`) but has no record of it."""
  due = config.validation_interval and step % config.validation_interval == 0
  return (0 < step < config.train_steps and bool(due) and
          step not in continuous_eval.read_evaluated(write_dir))


def step_options(config: TrainerConfig) -> gradients.StepOptions:
  """Returns the default train step's options from `config`."""
  return gradients.StepOptions(
      accumulation_steps=config.gradient_accumulation_steps,
      clip_norm=config.gradient_clip_norm,
      clip_value=config.gradient_clip_value)


def _coordinator(strategy: tf.distribute.Strategy, training: bool
                 ) -> tf.distribute.coordinator.ClusterCoordinator:
  """Returns the coordinator scheduling steps on the parameter-server
  cluster's workers, and says how the cluster is used."""
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  spec = tf.distribute.cluster_resolver.TFConfigClusterResolver(
  ).cluster_spec()
  num_workers = spec.num_tasks("worker")
  print(f"cluster | coordinator schedules steps on {num_workers} worker(s);"
        f" variables on {spec.num_tasks('ps')} ps", flush=True)
  if training and num_workers > 1:
    print(f"input | worker i of {num_workers} reads examples i, "
          f"i + {num_workers}, ... of the task's training data", flush=True)
  return coordinator


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


def make_input(task: task_lib.Task, training: bool,
               strategy: tf.distribute.Strategy, config: TrainerConfig,
               runtime: runtime_lib.RuntimeConfig,
               worker: cluster.WorkerInfo = cluster.WorkerInfo()
               ) -> inputs_lib.DistributedInput:
  """Builds this worker's training or evaluation input for `task`.

  Training input pipelines each read their own shard; every worker
  evaluates the whole eval split (the same number of steps everywhere, so no
  collective waits on a worker with fewer batches, and the metrics, summed
  over all replicas, keep their ratios).
  """

  def preprocess(batch, seed):
    return task.preprocess_batch(batch, training, seed)

  return inputs_lib.DistributedInput(
      strategy, lambda ctx: task.build_inputs(training, ctx),
      config.global_batch_size if training else config.eval_batch_size,
      training=training,
      batch_size_name=("trainer.global_batch_size" if training else
                       "trainer.eval_batch_size"),
      worker=worker, shard=training,
      private_threads=runtime.dataset_num_private_threads if training else 0,
      # Only an override costs a pipeline stage.
      batch_fn=(preprocess if task_lib.overrides(task, "preprocess_batch")
                else None),
      batch_fn_parallel_calls=runtime.dataset_batch_parallel_calls,
      deterministic=runtime.dataset_deterministic)


def _all_finite(variables) -> bool:
  """Whether every value of every variable is finite (one device read)."""
  checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables
            if v.dtype.is_floating]
  return bool(tf.reduce_all(checks).numpy()) if checks else True


# What each lease holder writes at the top of model_dir: it removes the
# leftovers of its own interrupted writes there, and only those.
_WRITTEN_BY = {
    lease.TRAINER: (checkpoints.SAVES, summaries.OPERATIVE_CONFIG_FILE,
                    "export"),
    lease.EVALUATOR: (actions.BEST_DIRECTORY, "eval",
                      actions.EARLY_STOPPING_RECORD),
}


def _lease_roles(mode: str, config: TrainerConfig) -> list:
  """Returns the leases on `model_dir` a chief running `mode` must hold: the
  trainer's to train, the evaluator's to write evaluation records (`best/`,
  early stopping, `eval/evaluated.json`). A plain `eval` takes none."""
  roles = []
  if mode in ("train", "train_and_eval"):
    roles.append(lease.TRAINER)
  records = (config.best_checkpoint.metric is not None or
             config.early_stopping.metric is not None)
  if mode in ("train_and_eval", "continuous_eval") or (
      mode == "eval" and records):
    roles.append(lease.EVALUATOR)
  return roles


@contextlib.contextmanager
def _write_directory(model_dir: str, worker: cluster.WorkerInfo, mode: str,
                     config: TrainerConfig):
  """Yields where this process writes: `model_dir` for the chief only.

  The chief takes its leases on `model_dir` (`trainer.lease`) before it
  changes anything there: a second run exits leaving it untouched. Then it
  removes what interrupted writes of its roles left. Other
  workers take part in every save and summary (they may involve
  collectives) but write into a temporary directory of their own, removed
  afterwards, so no two processes ever write the same file.

  Raises:
    errors.ConfigError: If another process holds one of the leases.
  """
  if worker.is_chief:
    os.makedirs(model_dir, exist_ok=True)
    roles = _lease_roles(mode, config)
    with lease.Lease(model_dir, roles, mode, warn=console.warning):
      checkpoints.remove_interrupted_saves(
          model_dir, [name for role in roles for name in _WRITTEN_BY[role]])
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


def _evaluate_continuously(
    controller: controller_lib.Controller, model_dir: str,
    config: TrainerConfig,
    early_stopping: Optional[actions.EarlyStopping]) -> Dict[str, Any]:
  """Evaluates every checkpoint of `model_dir` once, in step order, until the
  one at `train_steps` (see `trainer.continuous_eval`)."""

  def evaluate(prefix: str):
    controller.restore_checkpoint(prefix)
    return controller.step, controller.evaluate(config.validation_steps)

  return continuous_eval.run(
      model_dir, evaluate, config.train_steps,
      timeout=config.continuous_eval_timeout,
      stop_fn=early_stopping.stop_reason if early_stopping else None,
      max_to_keep=config.max_to_keep if config.keep_until_evaluated else None)
