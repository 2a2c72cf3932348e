"""Wires a Task, the runtime and the Orbit controller together for a mode.

`run` builds, in order: the strategy, the inputs, the training state (model,
optimizer, global step; `trainer.state`), the Orbit trainer and evaluator,
the checkpoint manager, the controller's collaborators and the actions
between loops, and the controller; then it runs the mode. Each feature lives
in its own module; this one only connects them.
"""

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from trainer import actions
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import model_dir as model_dir_lib
from trainer import runtime as runtime_lib
from trainer import state as state_lib
from trainer.data import inputs as inputs_lib
from trainer.data import stall_watch
from trainer.distribute import cluster
from trainer.distribute import parameter_server
from trainer.distribute import placement
from trainer.loop import continuous_eval
from trainer.loop import controller as controller_lib
from trainer.loop import evaluator as evaluator_lib
from trainer.loop import preemption
from trainer.loop import profiler
from trainer.loop import reporter
from trainer.loop import rollback
from trainer.loop import runners
from trainer.model import gradients
from trainer.model import named
from trainer.model import scaling
from trainer.model import task as task_lib
from trainer.report import run_report
from trainer.report import summaries
from trainer.storage import checkpoints
from trainer.storage import exports

MODES = ("train", "eval", "train_and_eval", "continuous_eval")
TrainerConfig = config_lib.TrainerConfig


@errors.raised_as_is()
def run(task: task_lib.Task, mode: str, model_dir: str,
        runtime: Optional[runtime_lib.RuntimeConfig] = None,
        config: Optional[TrainerConfig] = None,
        restore_dir: Optional[str] = None,
        receiver: Optional[preemption.Receiver] = None) -> Dict[str, Any]:
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
    receiver: The process's signal receiver (`train.py`'s); None: a
      signal is caught by Python handlers while training.

  Returns:
    The last evaluation's results (name -> NumPy value), or {} if none ran.

  Raises:
    errors.ConfigError: For an unknown mode, `eval` without a checkpoint, and
      settings that do not fit the task or the strategy.
  """
  started = time.perf_counter()
  runtime = runtime or runtime_lib.RuntimeConfig()
  config = config or TrainerConfig()
  if mode not in MODES:
    raise errors.ConfigError(
        f"`mode` ({mode!r}) must be one of: {', '.join(MODES)}.")
  cluster.configure(runtime)
  if runtime.distribution_strategy == "parameter_server":
    runtime, mode = parameter_server.role_runtime(runtime, mode, config)
    if runtime is None:
      return {}  # This process served as a worker or ps until stopped.
  elif (runtime.distribution_strategy == "multi_worker_mirrored" and
        cluster.task_role()[0] == "evaluator"):
    runtime, mode = cluster.evaluator_role(runtime, mode)
  restore_dir = restore_dir or model_dir
  if mode == "eval" and tf.train.latest_checkpoint(restore_dir) is None:
    raise errors.ConfigError(
        f"no checkpoint to evaluate in `model_dir` ({restore_dir}).")
  # A parameter server lost between loops (a save, the metrics read) is
  # named as one lost in a loop is.
  with (parameter_server.naming_lost_ps()
        if runtime.distribution_strategy == "parameter_server"
        else contextlib.nullcontext()):
    return _build_and_run(task, mode, model_dir, runtime, config,
                          restore_dir, started, receiver)


def _build_and_run(task: task_lib.Task, mode: str, model_dir: str,
                   runtime: runtime_lib.RuntimeConfig, config: TrainerConfig,
                   restore_dir: str, started: float,
                   receiver: Optional[preemption.Receiver]) -> Dict[str, Any]:
  """Builds the parts and the controller, then runs `mode`; see `run`.

  What building says (optimizers, placement, the restore) follows the
  header, which says what the build found.
  """
  with console.held() as release:
    parts = _build(task, mode, runtime, config)
    controller = None  # Built below, given the watcher.

    def progress() -> Optional[preemption.Progress]:
      return None if controller is None else controller.progress()

    watcher = (preemption.PreemptionWatcher(config.preemption_exit_code,
                                            parts.worker.num_workers,
                                            parts.worker.is_chief,
                                            progress_fn=progress,
                                            receiver=receiver)
               if parts.training else None)
    with (model_dir_lib.write_directory(model_dir, parts.worker, mode,
                                        parts.config) as write_dir,
          watcher or contextlib.nullcontext()):
      early_stopping = None
      if parts.config.early_stopping.metric is not None:
        early_stopping = actions.EarlyStopping(
            write_dir, parts.config.early_stopping, step_fn=parts.state.step)
      controller = _controller(parts, write_dir, restore_dir, watcher,
                               early_stopping)
      release(run_report.header(
          task_name=type(task).__name__, mode=mode, model_dir=model_dir,
          strategy=parts.state.strategy, runtime=parts.runtime,
          config=parts.config, num_workers=parts.worker.num_workers,
          restored_path=controller.restored_path, step=controller.step,
          training=parts.training, evaluating=parts.evaluating,
          unchecked_train_step=(
              task_lib.overrides(task, "train_step") and
              not (parts.trainer and parts.trainer.checks_loss_scaling))))
      if controller.step:
        _resume_input(parts, controller.step)
      with _stall_watch(parts, controller, watcher):
        return _run_mode(parts, controller, mode, model_dir, write_dir,
                         early_stopping, started)


def _stall_watch(parts: "_Parts", controller: controller_lib.Controller,
                 watcher: Optional[preemption.PreemptionWatcher]):
  """Returns the tf.data service's stall watch where training reads from
  it, else a context that does nothing.

  Its timeout and a signal end a loop that waits for a batch the same way:
  the step reached is saved while the loop waits, and the process exits.
  """
  if not (parts.training and parts.runtime.data_service):
    return contextlib.nullcontext()

  def saving_first(end: Callable[[int, float, str, str], bool]):
    def on_stall(step: int, waited: float, why: str) -> bool:
      saved = controller.save_while_waiting()
      if saved is None:  # A batch came during the save.
        return False
      return end(step, waited, why, saved)
    return on_stall

  def timed_out(step: int, waited: float, why: str, saved: str) -> bool:
    watcher.end_process(stall_watch.timeout_line(
        parts.runtime, step, waited, why, saved))
    return True

  def signalled(unused_step: int, waited: float, why: str,
                unused_saved: str) -> bool:
    # The receiver's line says what is saved, as at the grace period's end.
    return watcher.end_waiting(stall_watch.signal_reason(waited, why))

  # The variable, not `controller.step`: that moves only between loops, and
  # a loop of slow steps is no stall.
  return stall_watch.StallWatch(
      parts.runtime,
      lambda: parts.state.step() if parts.trainer.in_loop else None,
      saving_first(timed_out),
      signalled_fn=lambda: watcher is not None and watcher.received,
      on_signal=saving_first(signalled))


def _resume_input(parts: "_Parts", step: int) -> None:
  """Puts the training input where a run resumed at `step` left it, where
  the iterator is not in the checkpoint."""
  if parts.resume_input_fn is not None:
    # The chief's checkpoint cannot hold every worker's iterator (and some
    # pipelines cannot be saved at all): skip what was consumed instead.
    skipped = parts.resume_input_fn(step)
    console.info(f"input | resuming: skips the {skipped} batch(es) trained "
                 "on before")
  elif parts.restarts_input:
    console.info("input | resuming: the training input starts again from "
                 "its first batch (its position is not in the checkpoint)")


@dataclasses.dataclass
class _Parts:
  """What `run` builds for a mode before the controller.

  Attributes:
    task: What is trained.
    config: The loop settings, with batches rescaled for the replicas.
    runtime: The runtime settings.
    worker: This process's place among the workers.
    training: Whether the mode trains.
    evaluating: Whether the mode evaluates.
    state: The model, optimizer and global step.
    checkpoint: What checkpoints hold.
    trainer: Orbit trainer, when training.
    evaluator: Orbit evaluator, when evaluating.
    resume_input_fn: Skips consumed input on resume where the iterator is
      not in the checkpoint; None otherwise.
    restarts_input: Whether a resumed run reads the training input from
      its start.
    features_spec: The eval input's features, for export signatures.
  """
  task: task_lib.Task
  config: TrainerConfig
  runtime: runtime_lib.RuntimeConfig
  worker: cluster.WorkerInfo
  training: bool
  evaluating: bool
  state: state_lib.TrainState
  checkpoint: Optional[tf.train.Checkpoint] = None
  trainer: Optional[runners.TaskTrainer] = None
  evaluator: Optional[evaluator_lib.TaskEvaluator] = None
  resume_input_fn: Optional[Callable[[int], int]] = None
  restarts_input: bool = False
  features_spec: Any = None

  def export(self, directory: str) -> None:
    """Writes a serving SavedModel (EMA weights, if any) to `directory`: of
    the model, or of the one `export.model` names."""
    model = self.state.model
    if named.several(model):
      model = model[self.config.export.model]
    with self.state.averaged_weights():
      exports.export(
          model, self.task.export_signatures(model, self.features_spec),
          directory)


def _build(task: task_lib.Task, mode: str,
           runtime: runtime_lib.RuntimeConfig,
           config: TrainerConfig) -> _Parts:
  """Builds the strategy, inputs, training state and Orbit runners."""
  training = mode in ("train", "train_and_eval")
  evaluating = mode != "train"
  strategy = runtime_lib.create_strategy(runtime)
  runtime_lib.set_precision_policy(runtime)
  runtime_lib.seed_everything(runtime)
  worker = cluster.worker_info(strategy)
  config, replica_factor = _rescale(config, strategy.num_replicas_in_sync)
  console.log(f"strategy {type(strategy).__name__} with "
              f"{strategy.num_replicas_in_sync} replica(s); worker "
              f"{worker.worker_index} of {worker.num_workers}")
  train_input, eval_input = inputs_lib.for_mode(
      task, strategy, config, runtime, worker, training, evaluating)
  state = state_lib.build(
      task, strategy, (train_input or eval_input).dataset.element_spec,
      config, runtime, training=training, replica_factor=replica_factor)
  _report_placement(state)
  if (config.export.at_end or config.export.best or
      config.export.model is not None):  # A bound name is checked, used or not.
    named.check_choice("export.model", config.export.model, state.model)
  parts = _Parts(
      task=task, config=config, runtime=runtime, worker=worker,
      training=training, evaluating=evaluating, state=state,
      features_spec=eval_input.dataset.element_spec[0] if eval_input else None)
  items = state.checkpoint_items()
  if training:
    parts.trainer = _trainer(task, state, train_input, config, runtime)
    items["discarded_batches"] = parts.trainer.discarded_batches
    position = parts.trainer.input_resumption(config.input_position,
                                              worker.num_workers)
    if position == "checkpoint":
      items[checkpoints.INPUT_POSITION] = parts.trainer.train_iterator
    elif position == "skip":
      parts.resume_input_fn = parts.trainer.skip_input
    parts.restarts_input = position == "restart"
  if evaluating:
    parts.evaluator = evaluator_lib.TaskEvaluator(
        task, state.model, strategy, eval_input, state.global_step,
        run_eagerly=runtime.run_eagerly, weights=state.averaged_weights)
  parts.checkpoint = tf.train.Checkpoint(**items)
  return parts


def _report_placement(state: state_lib.TrainState) -> None:
  """Says where the variables live, read back from them, when a model is
  split over devices or its variables over parameter servers."""
  lines = []
  for model in named.named(state.model).values():
    if placement.active() or parameter_server.uses(state.strategy):
      lines += placement.variables_by_device(model)
    if parameter_server.uses(state.strategy):
      lines += parameter_server.shard_lines(model.variables)
  for line in lines:
    console.info(f"placement | {line}")


def _rescale(config: TrainerConfig,
             num_replicas: int) -> Tuple[TrainerConfig, float]:
  """Applies `trainer.batch_scaling`; returns the config and the learning
  rate factor."""
  config, replica_factor = scaling.rescale(config, num_replicas)
  if config.batch_scaling is not None:
    console.info(
        f"scaling | {num_replicas} replica(s), reference "
        f"{config.reference_replicas}: global batch "
        f"{config.global_batch_size}, eval batch {config.eval_batch_size}, "
        f"learning rate x{replica_factor:g}")
  return config, replica_factor


def _trainer(task: task_lib.Task, state: state_lib.TrainState,
             train_input: inputs_lib.DistributedInput, config: TrainerConfig,
             runtime: runtime_lib.RuntimeConfig) -> runners.TaskTrainer:
  """Builds the Orbit trainer: steps scheduled on a parameter-server
  cluster's workers, or run by the strategy here."""
  trainer_class = (parameter_server.ScheduledTaskTrainer
                   if parameter_server.uses(state.strategy)
                   else runners.TaskTrainer)
  return trainer_class(
      task, state.model, state.optimizer, state.strategy, train_input,
      state.global_step, run_eagerly=runtime.run_eagerly,
      enable_xla=runtime.enable_xla,
      step_options=gradients.StepOptions.from_config(config),
      check_loss_scaling=config.check_loss_scaling)


def _controller(parts: _Parts, write_dir: str, restore_dir: str,
                watcher: Optional[preemption.PreemptionWatcher],
                early_stopping: Optional[actions.EarlyStopping]
                ) -> controller_lib.Controller:
  """Builds the controller (which restores the newest checkpoint) and the
  actions between loops."""
  config, training, state = parts.config, parts.training, parts.state
  manager = checkpoints.create_manager(
      parts.checkpoint, write_dir, config.max_to_keep, state.global_step,
      init_fn=((lambda: parts.task.initialize(state.model, config.warm_start))
               if training else None),
      evaluated_fn=(
          (lambda: continuous_eval.read_evaluated(write_dir))
          if training and config.keep_until_evaluated else None))
  collaborators = {}
  if training:
    collaborators = _training_collaborators(parts, write_dir, watcher,
                                            early_stopping)
  controller = controller_lib.Controller(
      global_step=state.global_step, trainer=parts.trainer,
      evaluator=parts.evaluator, strategy=state.strategy,
      checkpoint_manager=manager,
      eval_summary_dir=(os.path.join(write_dir, "eval")
                        if parts.evaluating else None),
      options=controller_lib.ControllerOptions(
          checkpoint_interval=config.checkpoint_interval,
          restore_dir=restore_dir, partial_restore=not training),
      **collaborators)
  # Added once the controller exists: keeping the best checkpoint of an
  # evaluated checkpoint on disk copies the one the controller restored.
  controller.eval_actions = tuple(
      _eval_actions(parts, controller, write_dir, early_stopping))
  return controller


def _training_collaborators(
    parts: _Parts, write_dir: str,
    watcher: Optional[preemption.PreemptionWatcher],
    early_stopping: Optional[actions.EarlyStopping]) -> Dict[str, Any]:
  """Returns the controller's arguments that only training needs: the loop
  length, the train actions and the collaborators around a loop (the hooks
  in the order they report: progress line, profile, early stopping)."""
  config, state = parts.config, parts.state
  writer = summaries.LazyWriter(os.path.join(write_dir, "train"))
  hooks = [reporter.TrainReporter(
      writer, train_steps=config.train_steps,
      global_batch_size=config.global_batch_size,
      summary_interval=config.summary_interval,
      scalars_fn=lambda: state_lib.loss_scale_scalars(state.optimizer))]
  if config.profile_steps:
    hooks.append(profiler.ProfileWindow(config.profile_steps,
                                        os.path.join(write_dir, "train")))
  if early_stopping is not None:
    hooks.append(early_stopping)
  return dict(
      steps_per_loop=config.steps_per_loop,
      train_actions=[
          actions.OperativeConfigWriter(write_dir, writer),
          actions.StatefulRandomCheck(parts.trainer.traced_loop,
                                      parts.runtime.deterministic)],
      guard=rollback.NonFiniteGuard(
          config.on_nonfinite, config.max_rollbacks,
          finite_fn=state.all_finite, resume_input_fn=parts.resume_input_fn),
      preemption=watcher,
      hooks=hooks)


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
        write_dir, parts.config.best_checkpoint, step_fn=parts.state.step,
        save_fn=save_best,
        export_fn=parts.export if parts.config.export.best else None))
  if early_stopping is not None and parts.evaluating:
    found.append(early_stopping)
  if parts.evaluating:
    found.append(lambda unused_output: summaries.write_images(
        os.path.join(write_dir, "eval"), parts.evaluator.images,
        parts.state.step()))
  if parts.training and parts.evaluating:
    record = continuous_eval.EvaluatedRecord(write_dir)
    found.append(lambda output: record.add(parts.state.step(), output))
  return found


def _run_mode(parts: _Parts, controller: controller_lib.Controller,
              mode: str, model_dir: str, write_dir: str,
              early_stopping: Optional[actions.EarlyStopping],
              started: float) -> Dict[str, Any]:
  """Runs `mode` with the built controller; returns the last eval results.

  A mode that trains ends with the closing block (`trainer.run_report`).
  """
  config = parts.config
  start_step = controller.step
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
  directory = None
  if config.export.at_end:
    directory = os.path.join(write_dir, "export", str(controller.step))
    parts.export(directory)
    console.info(
        f"export | SavedModel of step {controller.step} in {directory}")
  best = next((action for action in controller.eval_actions
               if isinstance(action, actions.BestCheckpoint)), None)
  run_report.print_lines(run_report.closing(
      step=controller.step, start_step=start_step,
      seconds=time.perf_counter() - started,
      fingerprint=state_lib.weights_fingerprint(parts.state.model),
      results=output, best=best.record if best else None,
      best_dir=best.directory if best else None,
      checkpoint=(tf.train.latest_checkpoint(write_dir)
                  if parts.worker.is_chief else None),
      export=directory))
  return output


def _evaluation_missed(step: int, config: TrainerConfig,
                       write_dir: str) -> bool:
  """Whether `train_and_eval` was due to evaluate `step` (the restored one,
  below `train_steps`) but has no record of it."""
  due = config.validation_interval and step % config.validation_interval == 0
  return (0 < step < config.train_steps and bool(due) and
          step not in continuous_eval.read_evaluated(write_dir))


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
